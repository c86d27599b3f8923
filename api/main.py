"""The FastAPI application: `create_app(settings)`; `app` is the one uvicorn serves."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import RedirectResponse

from api import metrics, problems
from api.dashboard import mount_dashboard
from api.requests import RequestContext
from api.routes import comparison, datasets, health, jobs, keys, models, webhooks
from jobs.config import Settings
from jobs.config import settings as default_settings
from jobs.logs import configure_logging
from jobs.queue import make_celery

API_PREFIX = "/api/v1"


def create_app(settings: Settings | None = None, *, broker_url: str | None = None) -> FastAPI:
    settings = settings or default_settings

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        configure_logging(settings)  # when served, not on import (tests and the schema dump import the app)
        yield

    app = FastAPI(
        lifespan=lifespan,
        title="Quantization service",
        version="0.1.0",
        description="Upload an FP32 ONNX model and calibration data, pick a recipe, get a quantized model "
        "and an honest report of what quantization cost.",
        openapi_url=f"{API_PREFIX}/openapi.json",
        docs_url="/docs",
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.celery = make_celery(settings, broker_url)
    app.state.metrics_registry = metrics.make_registry(settings, app.state.celery)
    problems.install(app)
    app.add_middleware(RequestContext, fastapi=app, max_body_bytes=settings.max_json_body_bytes)
    routers = (
        models.router,
        comparison.router,
        datasets.router,
        jobs.router,
        health.router,
        webhooks.router,
        keys.router,
    )
    for router in routers:  # each straight onto the app: a router nested in a router is one more level to match
        app.include_router(router, prefix=API_PREFIX)
    app.include_router(metrics.router)  # /metrics, outside the versioned API

    @app.get("/openapi.json", include_in_schema=False)
    def openapi_at_root() -> RedirectResponse:
        """Where tools look first; without this the dashboard's fallback would answer with its HTML."""
        return RedirectResponse(app.openapi_url or "", status_code=308)

    mount_dashboard(app)  # the built frontend at /, for paths no API route answers
    return app


app = create_app()
