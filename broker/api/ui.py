"""The operator dashboard: static files from `broker/ui/` served at `/ui`.

Why static: the page must run offline (no CDN) and need no build step, and it
talks to the broker only through the public API with the operator's own bearer
token (entered in the page, kept in the browser's localStorage). So these
routes need no auth: they hand out the same HTML/JS/CSS to everyone, and every
piece of data behind them is guarded by the API's normal token check.

Only the files that ship in `broker/ui/` are served; a path that leaves that
folder or names an unknown file is a 404.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse, RedirectResponse

UI_DIR = Path(__file__).resolve().parent.parent / "ui"

_MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".json": "application/json",
    ".png": "image/png",
}

# The page needs nothing from anywhere but this origin.
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
        "script-src 'self'; connect-src 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}

router = APIRouter(include_in_schema=False)


def _file(name: str) -> FileResponse:
    path = (UI_DIR / name).resolve()
    if not path.is_relative_to(UI_DIR) or not path.is_file() or path.suffix not in _MEDIA_TYPES:
        raise HTTPException(status_code=404, detail=f"no dashboard file {name!r}")
    return FileResponse(path, media_type=_MEDIA_TYPES[path.suffix], headers=_HEADERS)


@router.get("/ui")
async def ui_root() -> RedirectResponse:
    """`/ui` -> `/ui/` so the page's relative asset paths resolve under /ui/."""
    return RedirectResponse(url="/ui/", status_code=307)


@router.get("/ui/")
async def ui_index() -> FileResponse:
    return _file("index.html")


@router.get("/ui/{name:path}")
async def ui_asset(name: str) -> FileResponse:
    return _file(name)
