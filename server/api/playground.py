"""The browser playground at ``GET /``: one page, its script and style, and sample paragraphs, all served
from ``server/api/static`` (no build step, no CDN: it works offline), under a restrictive
Content-Security-Policy. ``--playground false`` (``XLNETQA_PLAYGROUND=false``) leaves it out.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from fastapi import APIRouter, HTTPException
from fastapi.responses import Response

STATIC = Path(__file__).resolve().parent / "static"
# name -> media type; nothing else under /playground/ is served
FILES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "samples.json": "application/json",
    "favicon.svg": "image/svg+xml",
}
# The page loads only its own script and style and talks only to this server.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

playground_router = APIRouter(include_in_schema=False)


@cache
def _read(name: str) -> bytes:
    return (STATIC / name).read_bytes()


def _serve(name: str) -> Response:
    return Response(_read(name), media_type=FILES[name], headers=SECURITY_HEADERS)


@playground_router.get("/")
async def playground_page() -> Response:
    """The playground page."""
    return _serve("index.html")


@playground_router.get("/playground/{name}")
async def playground_file(name: str) -> Response:
    """The page's script, style and sample paragraphs (a fixed list: no path is read from the request)."""
    if name not in FILES or name == "index.html":
        raise HTTPException(status_code=404, detail="not found")
    return _serve(name)
