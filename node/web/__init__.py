"""The node's web page, served by the daemon on its API port: ``/`` is ``static/index.html``,
``/static/…`` its script and style. Every asset ships in the wheel (package data): the page makes
no request to anything but the node's own read-only API routes."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).parent / "static"

# The page runs only our own script and style, talks only to its own origin, and may not be
# framed (clickjacking): a page elsewhere can neither inject into it nor overlay it.
SECURITY_HEADERS = {
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}


def mount_page(app: FastAPI) -> None:
    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers=SECURITY_HEADERS)

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
