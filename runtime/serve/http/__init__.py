"""The OpenAI-compatible HTTP API over a Runtime (the `serve` extra: starlette, uvicorn): `app(rt)` is the ASGI
app, `runtime.serve.http.server.serve(...)` runs it with uvicorn (the `turnstile serve` command)."""

from runtime.serve.http.app import DEFAULT_MAX_BODY_BYTES, app, build
from runtime.serve.http.errors import ApiError
from runtime.serve.http.state import ServeState

__all__ = ["DEFAULT_MAX_BODY_BYTES", "ApiError", "ServeState", "app", "build"]
