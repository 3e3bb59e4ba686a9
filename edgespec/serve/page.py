"""The chat page (``edgespec/web/``) over HTTP: ``/`` and its files under ``/assets/``.

Each file goes out with its content type, an ETag, and a cache rule: the vendored
libraries carry their version in their names (``vendor/marked-18.3.0.esm.js``), so a
browser keeps them for a year; the page's own files are revalidated on every load
(a 304 when unchanged), so a new edgespec never runs a stale page. The page's
Content-Security-Policy lets it load scripts, styles and connections from this
server only: nothing reaches another host, and an inline script cannot run.
"""

from __future__ import annotations

import hashlib
from importlib import resources

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException

TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".mjs": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
         ".svg": "image/svg+xml", ".png": "image/png", ".txt": "text/plain; charset=utf-8"}
VENDOR_CACHE = "public, max-age=31536000, immutable"  # versioned names: never changes
OWN_CACHE = "no-cache"  # kept, but asked again (ETag) before each use
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'none'; "
       "frame-ancestors 'none'")


def add_page_routes(app: FastAPI) -> None:
    """``GET /``: the page; ``GET /assets/PATH``: a file of ``edgespec/web/``."""
    web = resources.files("edgespec.serve").joinpath("web")

    def send(request: Request, parts: list[str]) -> Response:
        suffix = "." + parts[-1].rpartition(".")[2] if "." in parts[-1] else ""
        if suffix not in TYPES or any(p in ("", ".", "..") or p.startswith(".") for p in parts):
            raise HTTPException(404, "no such file")
        file = web.joinpath(*parts)
        if not file.is_file():
            raise HTTPException(404, "no such file")
        body = file.read_bytes()
        headers = {"ETag": '"' + hashlib.sha256(body).hexdigest()[:32] + '"',
                   "Cache-Control": VENDOR_CACHE if parts[0] == "vendor" else OWN_CACHE,
                   "X-Content-Type-Options": "nosniff"}
        if suffix == ".html":
            headers["Content-Security-Policy"] = CSP
        if request.headers.get("if-none-match") == headers["ETag"]:
            return Response(status_code=304, headers=headers)
        return Response(body, media_type=TYPES[suffix], headers=headers)

    @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def page(request: Request):
        return send(request, ["chat.html"])

    @app.api_route("/assets/{path:path}", methods=["GET", "HEAD"], include_in_schema=False)
    async def asset(request: Request, path: str):
        return send(request, path.split("/"))
