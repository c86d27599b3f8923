"""Start the service's processes on one machine: migrations, API (uvicorn), workers (Celery).

Used by `make run` (`python -m launcher`) and by the end-to-end tests, so both exercise the
same real processes the Dockerfile runs, without Docker.
"""
