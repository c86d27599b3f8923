"""Celery tasks: thin adapters from job rows to quantcore calls."""
