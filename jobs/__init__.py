"""The contract between the API and the worker: settings, DB models and queries, recipe, tasks."""
