"""llama-server's `POST /infill`: fill-in-the-middle for code editors, for models with FIM tokens.

    {"input_prefix": str, "input_suffix": str, "input_extra"?: [{"filename"?, "text"}], "prompt"?: str, ...}
    -> /completion's answer (the same sampling fields, streaming, shape)

The prompt is llama-server's `format_prompt_infill` (repo-level FIM: the extra chunks after `[FIM_REP]myproject`
and `[FIM_SEP]filename` headers, then `[FIM_PRE]prefix[FIM_SUF]suffix[FIM_MID]prompt`, prefix and suffix cut
to fit a batch 3:1), built as token ids (`infill_tokens`, pure) and run as a raw completion on the slot. A model
without FIM prefix, suffix and middle tokens gets llama-server's 501 `not_supported_error` "Infill is not
supported by this model: … token is missing."; malformed fields llama-server's 400s.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from starlette.routing import Route

from runtime.api import Runtime
from runtime.model_info import ModelInfo
from runtime.serve.http.errors import ApiError
from runtime.serve.http.llama.completion import CompletionEndpoint
from runtime.serve.http.state import ServeState

__all__ = ["InfillEndpoint", "infill_tokens", "routes"]

Tokenize = Callable[[str], Awaitable[list[int]]]
_CHUNK_PREFIX = "\n\n--- snippet ---\n\n"


def _not_supported(info: ModelInfo) -> ApiError | None:
    missing = "".join(
        f"{name} token is missing. " for name, t in zip(("prefix", "suffix", "middle"), info.fim[:3], strict=True)
        if t < 0
    )  # fmt: skip
    if not missing:
        return None
    return ApiError(501, f"Infill is not supported by this model: {missing}", type="not_supported_error")


def _check(body: dict[str, Any]) -> list[dict[str, Any]]:
    if "prompt" in body and not isinstance(body["prompt"], str):
        raise ApiError.bad_request('"prompt" must be a string')
    for name in ("input_prefix", "input_suffix"):
        if name not in body:
            raise ApiError.bad_request(f'"{name}" is required')
        if not isinstance(body[name], str):
            raise ApiError.bad_request(f'"{name}" must be a string')
    extra = body.get("input_extra", [])
    if not isinstance(extra, list):
        raise ApiError.bad_request('"input_extra" must be an array of {"filename": string, "text": string}')
    for chunk in extra:
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise ApiError.bad_request('extra_context chunk must contain a "text" field with a string value')
        if "filename" in chunk and not isinstance(chunk["filename"], str):
            raise ApiError.bad_request('extra_context chunk\'s "filename" field must be a string')
    return extra


async def infill_tokens(
    info: ModelInfo,
    tokenize: Tokenize,
    prefix: str,
    suffix: str,
    extra: Sequence[dict[str, Any]],
    prompt: list[int],
    *,
    n_predict: int,
) -> list[int]:
    """llama-server's format_prompt_infill (spm_infill off), over token ids."""
    pre, suf, mid, rep, sep = info.fim
    n_batch, n_ctx = info.n_batch, info.n_ctx
    tokens_prefix, tokens_suffix = await tokenize(prefix), await tokenize(suffix)
    extra_tokens: list[int] = []
    if rep >= 0:
        extra_tokens += [rep, *await tokenize("myproject\n")]
    for chunk in extra:
        if sep >= 0:
            extra_tokens += [sep, *await tokenize(chunk.get("filename", "tmp") + "\n")]
        else:
            extra_tokens += await tokenize(_CHUNK_PREFIX)
        extra_tokens += await tokenize(chunk["text"])
    if sep >= 0:
        extra_tokens += [sep, *await tokenize("filename\n")]
    n_prefix_take = min(len(tokens_prefix), 3 * (n_batch // 4))
    n_suffix_take = min(len(tokens_suffix), max(0, n_batch // 4 - (2 + len(prompt))))
    n_extra_take = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra_tokens))
    head = [pre, *tokens_prefix[len(tokens_prefix) - n_prefix_take :], *prompt]
    tail = [suf, *tokens_suffix[:n_suffix_take]]
    if info.add_bos:
        head.insert(0, info.bos_id)
    taken = extra_tokens[len(extra_tokens) - n_extra_take :] if n_extra_take else []
    return [*taken, *head, *tail, mid]


class InfillEndpoint(CompletionEndpoint):
    """/infill: the body's prompt made from the FIM fields, then answered as /completion."""

    async def prepare(self, body: dict[str, Any]) -> dict[str, Any]:
        rt: Runtime = self.state.require()
        info = rt.model_info()
        refusal = _not_supported(info)
        if refusal is not None:
            raise refusal
        extra = _check(body)

        async def plain(text: str) -> list[int]:
            return await rt.tokenize(text, add_special=False, parse_special=False)

        prompt = await rt.tokenize(body.get("prompt", ""), add_special=False, parse_special=True)
        n_predict = int(self.state.llama.sampling.get("max_tokens", -1))
        tokens = await infill_tokens(
            info, plain, body["input_prefix"], body["input_suffix"], extra, prompt, n_predict=n_predict
        )
        return {**body, "prompt": tokens}


def routes(state: ServeState, *, max_body_bytes: int, request_timeout: float | None) -> list[Route]:
    endpoint = InfillEndpoint(state, oai=False, max_body_bytes=max_body_bytes, request_timeout=request_timeout)
    return [Route("/infill", endpoint, methods=["POST"])]
