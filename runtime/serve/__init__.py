"""turnstile behind an OpenAI-compatible HTTP API: `runtime.serve.app(rt)` is the ASGI app (Starlette),
`runtime.serve.server.serve(...)` runs it with uvicorn (the `turnstile serve` command). Needs the
`serve` extra (starlette, uvicorn)."""

from runtime.serve.app import DEFAULT_MAX_BODY_BYTES, app, build
from runtime.serve.errors import ApiError
from runtime.serve.state import ServeState

__all__ = ["DEFAULT_MAX_BODY_BYTES", "ApiError", "ServeState", "app", "build"]
