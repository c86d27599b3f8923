"""The FastAPI application: `create_app(settings)`; `app` is the one uvicorn serves."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI

from api import problems
from api.dashboard import mount_dashboard
from api.routes import comparison, datasets, health, jobs, models, webhooks
from jobs.config import Settings
from jobs.config import settings as default_settings
from jobs.queue import make_celery

API_PREFIX = "/api/v1"


def create_app(settings: Settings | None = None, *, broker_url: str | None = None) -> FastAPI:
    settings = settings or default_settings
    app = FastAPI(
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
    problems.install(app)
    api = APIRouter(prefix=API_PREFIX)
    for router in (models.router, comparison.router, datasets.router, jobs.router, health.router, webhooks.router):
        api.include_router(router)
    app.include_router(api)
    mount_dashboard(app)  # the built frontend at /, for paths no API route answers
    return app


app = create_app()
