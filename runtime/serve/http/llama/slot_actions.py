"""`POST /slots/{id}?action=save|restore|erase`: llama-server's slot actions on turnstile's one slot.

    save     {"filename": F}  write what the slot holds to --slot-save-path/F
             -> {"id_slot", "filename", "n_saved", "n_written", "timings": {"save_ms"}}
    restore  {"filename": F}  keep the slot's state in the cache, then load F into the slot
             -> {"id_slot", "filename", "n_restored", "n_read", "timings": {"restore_ms"}}
    erase                     forget what the slot holds -> {"id_slot", "n_erased"}

As llama-server: without `--slot-save-path` a 501 `not_supported_error`; a slot id that is not a number, an
id other than 0 (turnstile has one slot), an unknown action or a filename that is not a plain file name
(no directory, no `..`, at most 255 bytes) a 400; a restore that fails a 400 "Unable to restore slot: …"
with the slot unchanged. The file is turnstile's (the disk tier's record with the slot's checkpoints), so
a restored hybrid or sliding-window model reuses the prefix too (`runtime.slot.files`).

The one slot holds every key's conversations: with several API keys the actions are refused (501), so no
key can save, restore over or erase what another key's conversation left there.
"""

from __future__ import annotations

import time
import unicodedata
from pathlib import Path
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from runtime.errors import ContextOverflow, StateFormatError
from runtime.serve.http.errors import ApiError
from runtime.serve.http.state import ServeState
from runtime.serve.http.tenants import tenant_of

__all__ = ["slot_action", "valid_filename"]


def _not_supported(message: str) -> ApiError:
    return ApiError(501, message, type="not_supported_error")


def valid_filename(name: str) -> bool:
    """llama.cpp's `fs_validate_filename`, for what it refuses: empty or over 255 bytes, a path separator or
    a drive colon, control characters, `.` and `..`, leading or trailing spaces and dots at the end."""
    if not name or len(name.encode("utf-8", "surrogatepass")) > 255:
        return False
    if name in {".", ".."} or name.strip(" ") != name or name.endswith("."):
        return False
    return not any(c in '/\\:*?"<>|' or unicodedata.category(c)[0] == "C" for c in name)


async def _filename(request: Request) -> str:
    try:
        body = msgspec.json.decode(await request.body())
    except msgspec.DecodeError as e:
        raise ApiError(400, f"invalid JSON body: {e}") from None
    name = body.get("filename") if isinstance(body, dict) else None
    if not isinstance(name, str):
        raise ApiError(400, "filename: a string is required")
    if not valid_filename(name):
        raise ApiError(400, "Invalid filename")
    return name


async def _act(state: ServeState, request: Request) -> dict[str, Any]:
    path = state.llama.slot_save_path
    if path is None:
        raise _not_supported("This server does not support slots action. Start it with `--slot-save-path`")
    if tenant_of(request).prefix:
        raise _not_supported("slot actions are off when several API keys share the server (the slot holds all)")
    try:
        id_slot = int(request.path_params["id_slot"])
    except ValueError:
        raise ApiError(400, "Invalid slot ID") from None
    action = request.query_params.get("action", "")
    if action not in {"save", "restore", "erase"}:
        raise ApiError(400, "Invalid action")
    if id_slot != 0:
        raise ApiError(400, "Invalid slot ID")
    rt = state.require()
    if action == "erase":
        return {"id_slot": id_slot, "n_erased": await rt.erase_slot()}
    name = await _filename(request)
    target = Path(path) / name
    t0 = time.perf_counter()
    if action == "save":
        done = await rt.save_slot(target)
        n_tokens, n_bytes, timing = "n_saved", "n_written", "save_ms"
    else:
        try:
            done = await rt.restore_slot(target)
        except FileNotFoundError:
            raise ApiError(400, f"Unable to restore slot: no file {name!r}") from None
        except (StateFormatError, ContextOverflow) as e:
            raise ApiError(400, f"Unable to restore slot: {e}") from None
        n_tokens, n_bytes, timing = "n_restored", "n_read", "restore_ms"
    ms = (time.perf_counter() - t0) * 1000
    return {
        "id_slot": id_slot,
        "filename": name,
        n_tokens: done.n_tokens,
        n_bytes: done.n_bytes,
        "timings": {timing: ms},
    }


async def slot_action(state: ServeState, request: Request) -> Response:
    try:
        body = await _act(state, request)
    except ApiError as e:
        return Response(e.body(), status_code=e.status, media_type="application/json", headers=e.headers)
    return Response(msgspec.json.encode(body), media_type="application/json")
