"""Logging for every process: JSON lines in production, text for development, with context.

    {"time": "2026-11-22T04:31:07.512Z", "level": "INFO", "logger": "worker.runner", "process": 4711,
     "message": "...", "job_id": "6f0c...", "request_id": "..."}

`job_id` and `request_id` live in context variables: whatever runs inside `job_context(job_id)` (a
worker running a job, and the heartbeat thread it starts) or inside an API request logs them on
every line, whichever module logs. `configure_logging(settings)` installs one stderr handler on the
root logger and routes uvicorn's and Celery's loggers through it.
"""

from __future__ import annotations

import functools
import json
import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, TypeVar

from jobs.config import Settings

job_id_var: ContextVar[str | None] = ContextVar("job_id", default=None)
request_id_var: ContextVar[str | None] = ContextVar("request_id", default=None)
CONTEXT = {"job_id": job_id_var, "request_id": request_id_var}

# Attributes every LogRecord has; anything else on a record came from `extra=` and is logged as a field.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}
F = TypeVar("F", bound=Callable[..., Any])


class ContextFilter(logging.Filter):
    """Copies the context variables onto each record (None when unset)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, var in CONTEXT.items():
            if getattr(record, name, None) is None:
                setattr(record, name, var.get())
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line; `extra=` fields and the context are top-level keys."""

    def format(self, record: logging.LogRecord) -> str:
        moment = datetime.fromtimestamp(record.created, UTC)
        entry: dict[str, Any] = {
            "time": moment.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "process": record.process,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and value is not None:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """`time level logger [pid] message  job=… request=…` for reading in a terminal."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s [%(process)d] %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        context = " ".join(f"{name}={value}" for name in CONTEXT if (value := getattr(record, name, None)))
        return f"{line}  {context}" if context else line


def configure_logging(settings: Settings) -> None:
    """Idempotent: replaces the root handlers; uvicorn's and Celery's loggers propagate to root
    (uvicorn's access log is dropped: `api.requests` logs each request with its id)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(ContextFilter())
    handler.setFormatter(JsonFormatter() if settings.json_logs else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(settings.log_level)
    for name in ("uvicorn", "uvicorn.error", "celery", "celery.task"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    # The API writes its own access line (`api.access`, with the request id); silence uvicorn's twin.
    access = logging.getLogger("uvicorn.access")
    access.handlers[:] = [logging.NullHandler()]
    access.propagate = False


@contextmanager
def log_context(**values: str) -> Iterator[None]:
    """Bind context fields (job_id, request_id) for the code inside the block."""
    tokens = [(CONTEXT[name], CONTEXT[name].set(value)) for name, value in values.items()]
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


def job_context(function: F) -> F:
    """Decorate `f(job_id, ...)`: every line logged while it runs carries that job_id."""

    @functools.wraps(function)
    def wrapper(job_id: Any, *args: Any, **kwargs: Any) -> Any:
        with log_context(job_id=str(job_id)):
            return function(job_id, *args, **kwargs)

    return wrapper  # type: ignore[return-value]
