"""The web console (issue 17 item 3): ``/`` and ``/console`` answer its page, ``/console/static``
its ES modules and stylesheet (package data, ``hivemux/api/console``; no CDN, no build step).

The page holds no secret and needs no token to load: it asks for one (pasted, or ``?token=``,
kept in the tab's sessionStorage) and then reads the same ``/api/v1`` endpoints and change stream
as any client, so a tenant's console shows what that tenant's token may read, nothing more.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

CONSOLE_DIR = Path(str(resources.files("hivemux.api") / "console"))
router = APIRouter(include_in_schema=False)
# The page is small and changes with the package: no caching, so an upgrade shows at once.
_NO_CACHE = {"Cache-Control": "no-cache"}


@router.get("/")
async def root() -> RedirectResponse:
    return RedirectResponse("/console", status_code=307)


@router.get("/console")
async def console() -> FileResponse:
    return FileResponse(CONSOLE_DIR / "index.html", media_type="text/html", headers=_NO_CACHE)


def static_files() -> StaticFiles:
    """Mounted at ``/console/static`` by `create_app`."""
    return StaticFiles(directory=CONSOLE_DIR, html=False)
