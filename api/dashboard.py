"""Serve the built dashboard (`frontend/dist`, made by `npm run build`) at `/`.

Hashed bundles under `/assets` are cached for good. Any other GET that no API route answers gets
`index.html` (the single-page app routes in the browser), except under `/api` and `/docs`, which
keep their problem+json 404. The fallback is the router's `default` app, called only when no route
matched, so routes added after it are never shadowed. Nothing is mounted when the dashboard was not
built: the API runs the same without Node.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send

DIST = Path(__file__).resolve().parent.parent / "frontend" / "dist"
_NOT_PAGES = ("/api/", "/docs")


def mount_dashboard(app: FastAPI, dist: Path | None = None) -> None:
    dist = (dist or DIST).resolve()
    index = dist / "index.html"
    if not index.is_file():
        return
    if (dist / "assets").is_dir():
        app.mount("/assets", _ImmutableStatic(directory=dist / "assets"), name="dashboard-assets")
    not_found = app.router.default

    async def dashboard(scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        is_page = scope["type"] == "http" and scope["method"] in ("GET", "HEAD")
        if not is_page or path == "/api" or path.startswith(_NOT_PAGES):
            await not_found(scope, receive, send)
            return
        candidate = (dist / path.lstrip("/")).resolve()
        if candidate != dist and candidate.is_file() and candidate.is_relative_to(dist):
            response = FileResponse(candidate)  # e.g. a favicon Vite copied from public/
        else:
            response = FileResponse(index, headers={"Cache-Control": "no-cache"})
        await response(scope, receive, send)

    app.router.default = dashboard


class _ImmutableStatic(StaticFiles):
    """Vite names bundles by content hash, so a cached copy never goes stale."""

    async def get_response(self, path, scope):
        response = await super().get_response(path, scope)
        if response.status_code == 200:
            response.headers["Cache-Control"] = "public, max-age=31536000, immutable"
        return response
