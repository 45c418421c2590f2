"""The web page `turnstile serve` answers at `/`: a single-page app shipped in this package (static/:
index.html, ES modules, CSS; no build step, no CDN, no request beyond the server's own origin).

    GET /            index.html
    GET /ui/{file}   the page's other files (only the files in static/, by name; nothing else is served)

These paths need no API key (the page asks for it and sends it with its API calls); every response carries a
Content-Security-Policy that allows nothing but the server's own origin.
"""

from __future__ import annotations

from importlib import resources

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

__all__ = ["PREFIX", "files", "routes"]

PREFIX = "/ui/"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}


def files() -> dict[str, bytes]:
    """The page's files by name (read once from the package)."""
    root = resources.files(__name__).joinpath("static")
    out: dict[str, bytes] = {}
    for entry in root.iterdir():
        suffix = "." + entry.name.rsplit(".", 1)[-1]
        if entry.is_file() and suffix in _TYPES:
            out[entry.name] = entry.read_bytes()
    return out


def routes() -> list[Route]:
    page = files()

    def serve(name: str) -> Response:
        body = page.get(name)
        if body is None:
            return Response(
                b'{"error":{"message":"not found","type":"not_found_error"}}', 404, media_type="application/json"
            )
        headers = {"content-security-policy": CSP, "cache-control": "no-cache", "x-content-type-options": "nosniff"}
        return Response(body, media_type=_TYPES["." + name.rsplit(".", 1)[-1]], headers=headers)

    async def index(_request: Request) -> Response:
        return serve("index.html")

    async def asset(request: Request) -> Response:
        return serve(str(request.path_params["name"]))

    return [Route("/", index, methods=["GET"]), Route(PREFIX + "{name}", asset, methods=["GET"])]


def is_public(path: str) -> bool:
    """Whether a path is the page's (served without an API key)."""
    name = path[len(PREFIX) :]
    return path == "/" or (path.startswith(PREFIX) and bool(name) and "/" not in name)
