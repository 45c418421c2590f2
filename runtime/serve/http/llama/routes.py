"""llama-server's informational routes, in its shapes:

    GET  /props              the generation defaults, n_ctx, model path, chat template(s), BOS/EOS, build info
    POST /props              501 (llama-server answers so unless started with --props; turnstile has none)
    GET  /slots              the one slot (501 with --no-slots, as llama-server's)
    POST /slots/{id}?action=save|restore|erase   the slot to/from a file (slot_actions.py; 501 without --slot-save-path)
    GET  /models, /v1/models the model, in llama-server's shape (OpenAI's `data` list plus its `models`)
    GET  /v1/health          as /health

Errors use llama-server's `not_supported_error` (501) where it uses it.
"""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from runtime.serve.http.errors import ApiError
from runtime.serve.http.llama import slot_actions
from runtime.serve.http.llama.options import SYSTEM_FINGERPRINT
from runtime.serve.http.state import ServeState

__all__ = ["not_supported", "routes"]


def not_supported(message: str) -> ApiError:
    """llama-server's answer for a feature that is off: 501, type not_supported_error."""
    return ApiError(501, message, type="not_supported_error")


def _json(body: Any, status: int = 200) -> Response:
    return Response(msgspec.json.encode(body), status_code=status, media_type="application/json")


def _error(e: ApiError) -> Response:
    return Response(e.body(), status_code=e.status, media_type="application/json", headers=e.headers)


def _settings(state: ServeState) -> dict[str, Any]:
    d = state.llama.sampling
    return {
        "seed": d.get("seed", -1),
        "temperature": d.get("temperature", 0.8),
        "top_k": 40,
        "top_p": 0.95,
        "min_p": 0.05,
        "n_predict": d.get("max_tokens", -1),
        "repeat_penalty": 1.0,
        "repeat_last_n": 64,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "typical_p": 1.0,
        "mirostat": 0,
        "dry_multiplier": 0.0,
        "xtc_probability": 0.0,
        "ignore_eos": False,
        "stop": [],
    }


def routes(state: ServeState) -> list[Route]:
    async def props(_request: Request) -> Response:
        try:
            rt = state.require()
        except ApiError as e:
            return _error(e)
        info = rt.model_info()
        body: dict[str, Any] = {
            "default_generation_settings": {"params": _settings(state), "n_ctx": info.n_ctx},
            "total_slots": 1,
            "model_alias": state.model,
            "model_path": info.path,
            "modalities": {"vision": False, "video": False, "audio": False},
            "endpoint_slots": state.llama.slots,
            "endpoint_props": False,
            "endpoint_metrics": True,
            "ui": False,
            "chat_template": info.chat_template,
            "bos_token": info.bos_token,
            "eos_token": info.eos_token,
            "build_info": SYSTEM_FINGERPRINT,
            "is_sleeping": False,
        }
        if info.chat_template_tool_use is not None:
            body["chat_template_tool_use"] = info.chat_template_tool_use
        return _json(body)

    async def set_props(_request: Request) -> Response:
        return _error(not_supported("This server does not support changing global properties"))

    async def slots(_request: Request) -> Response:
        if not state.llama.slots:
            return _error(not_supported("This server does not support slots endpoint. Start it with `--slots`"))
        try:
            rt = state.require()
        except ApiError as e:
            return _error(e)
        busy = rt.stats().scheduler.running > 0
        return _json([{"id": 0, "n_ctx": rt.n_ctx, "is_processing": busy, "speculative": False}])

    async def slot_action(request: Request) -> Response:
        return await slot_actions.slot_action(state, request)

    async def models(_request: Request) -> Response:
        rt = state.runtime
        name = state.model
        meta = None
        if rt is not None:
            info = rt.model_info()
            engine = {k: v for k, v in msgspec.structs.asdict(rt.engine_info()).items() if k != "model"}
            meta = {**engine, "n_vocab": info.n_vocab, "n_ctx": info.n_ctx, "n_ctx_train": info.n_ctx_train}
        card = {
            "id": name,
            "aliases": list(state.llama.aliases) or [name],
            "tags": list(state.llama.tags),
            "object": "model",
            "created": int(state.started),
            "owned_by": "turnstile",
            "meta": meta,
        }
        entry = {"name": name, "model": name, "type": "model", "capabilities": ["completion"]}
        return _json({"models": [entry], "object": "list", "data": [card]})

    async def health(_request: Request) -> Response:
        try:
            state.require()
        except ApiError as e:
            return _error(e)
        return _json({"status": "ok"})

    return [
        Route("/props", props, methods=["GET"]),
        Route("/props", set_props, methods=["POST"]),
        Route("/slots", slots, methods=["GET"]),
        Route("/slots/{id_slot}", slot_action, methods=["POST"]),
        Route("/models", models, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/health", health, methods=["GET"]),
    ]
