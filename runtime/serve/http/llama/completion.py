"""llama-server's completion routes over `Runtime.complete_prompt` (a raw prompt, no chat template):

    POST /completion, /completions   llama-server's own shape: {"content", "tokens", "stop", "stop_type",
                                     "tokens_predicted", "tokens_evaluated", "tokens_cached", "timings", ...}
    POST /v1/completions             OpenAI's legacy completions: {"choices": [{"text", "finish_reason"}], ...}

Streamed (`"stream": true`) as server-sent events: llama-server's shape sends one event per piece and a last
one with `"stop": true` and the totals; OpenAI's sends `text_completion` chunks, a last one with the finish
reason, then `data: [DONE]`. Several prompts get one answer each, in order (a JSON array, or the events of
each in turn). The request is read by `completion_request`.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncGenerator
from typing import Any, cast

import msgspec
from starlette.routing import Route

from runtime.api import Runtime
from runtime.loop.stream import Piece
from runtime.reply import ProbText, Progress, Reply, TokenProb
from runtime.serve.asgi import Receive, Scope, Send
from runtime.serve.http.chat.convert import timings
from runtime.serve.http.endpoint import ClientGone, read_body, send_bytes, send_error
from runtime.serve.http.errors import ApiError, to_api_error
from runtime.serve.http.event_stream import SSE_HEADERS
from runtime.serve.http.llama.completion_request import CompletionCall, Prompt, parse
from runtime.serve.http.llama.live import TokenClock, progress_json
from runtime.serve.http.llama.options import SYSTEM_FINGERPRINT
from runtime.serve.http.llama.probs import probs_json, trim_stop
from runtime.serve.http.llama.sampler_fields import logit_bias, reported_bias
from runtime.serve.http.state import ServeState
from runtime.serve.http.watch import Phase, run_watched

__all__ = ["NATIVE_PATHS", "OAI_PATHS", "SYSTEM_FINGERPRINT", "routes"]

NATIVE_PATHS = ("/completion", "/completions")
OAI_PATHS = ("/v1/completions",)

_decoder = msgspec.json.Decoder()


def _stop_type(reply: Reply) -> str:
    if reply.finish_reason == "length":
        return "limit"
    return "word" if reply.stop_sequence else "eos"


def _finish(reply: Reply) -> str:
    return "length" if reply.finish_reason == "length" else "stop"


class CompletionEndpoint:
    """One completion route (an ASGI app): `oai` chooses OpenAI's shape over llama-server's."""

    def __init__(self, state: ServeState, *, oai: bool, max_body_bytes: int, request_timeout: float | None) -> None:
        self.state = state
        self.oai = oai
        self.max_body_bytes = max_body_bytes
        self.request_timeout = request_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            raw = await read_body(scope, receive, self.max_body_bytes)
            body = _decoder.decode(raw) if raw.strip() else None
            if not isinstance(body, dict):
                raise ApiError.bad_request("the request body must be a JSON object with a 'prompt'")
            call = parse(await self.prepare(body), self.state.llama.sampling, oai=self.oai)
            rt = self.state.require()
            if call.logit_bias is not None:
                call.options["logit_bias"] = await logit_bias(rt, call.logit_bias)
            eog = rt.model_info().eog_tokens if call.options.get("ignore_eos") else ()
            call.settings["logit_bias"] = reported_bias(call.options, eog)
            prompts = [await _tokens(rt, p) for p in call.prompts]
        except ClientGone:
            return
        except Exception as e:
            await send_error(send, to_api_error(e))
            return

        async def work(phase: Phase) -> None:
            if call.stream:
                await self._stream(rt, call, prompts, send, phase)
            else:
                await self._complete(rt, call, prompts, send, phase)

        async def fail(e: Exception) -> None:
            await send_error(send, to_api_error(e))

        phase = await run_watched(receive, work, fail)
        if phase.gone:
            self.state.disconnects += 1

    async def prepare(self, body: dict[str, Any]) -> dict[str, Any]:
        """The body to parse (a route built on this one, /infill, makes its prompt here)."""
        return body

    def _options(self, call: CompletionCall) -> dict[str, Any]:
        return {"timeout": self.request_timeout, **call.options}

    async def _complete(
        self, rt: Runtime, call: CompletionCall, prompts: list[tuple[list[int], str]], send: Send, phase: Phase
    ) -> None:
        results: list[dict[str, Any]] = []
        replies: list[tuple[Reply, str]] = []
        for i, (tokens, text) in enumerate(prompts):
            reply = await rt.complete_prompt(tokens, **self._options(call))
            if reply.probs and reply.stop_sequence:  # llama-server: the stop string's tokens leave the probabilities
                n_stop = len(await rt.tokenize(reply.stop_sequence, add_special=False, parse_special=False))
                reply = msgspec.structs.replace(reply, probs=tuple(trim_stop(reply.probs, n_stop)))
            replies.append((reply, text))
            if not self.oai:
                results.append(self._native(call, reply, text, i, final=True))
        body: Any = self._oai(call, replies) if self.oai else (results[0] if len(results) == 1 else results)
        phase.ending = True
        await send_bytes(send, 200, json.dumps(body, ensure_ascii=False).encode())

    def _native(self, call: CompletionCall, reply: Reply, prompt: str, index: int, *, final: bool) -> dict[str, Any]:
        u = reply.usage
        return {
            "index": index,
            "content": reply.text if not final or not call.stream else "",
            "tokens": list(reply.tokens) if call.return_tokens and not call.stream else [],
            "id_slot": 0,
            "stop": True,
            "model": self.state.model,
            "tokens_predicted": u.generated_tokens,
            "tokens_evaluated": u.prompt_tokens,
            "generation_settings": call.settings,
            "prompt": prompt,
            "has_new_line": "\n" in reply.text,
            "truncated": False,
            "stop_type": _stop_type(reply),
            "stopping_word": reply.stop_sequence or "",
            "tokens_cached": u.prompt_tokens + u.generated_tokens,
            "timings": llama_timings(reply),
            **self._probs(call, reply.probs, "completion_probabilities", stream=call.stream),
        }

    def _probs(self, call: CompletionCall, probs: Any, key: str, *, stream: bool = False) -> dict[str, Any]:
        """{key: the probabilities} when the request asked for them and there are some, else {}."""
        if not probs or stream:
            return {}
        return {key: probs_json(probs, post=bool(call.options.get("post_sampling_probs")))}

    def _oai(self, call: CompletionCall, replies: list[tuple[Reply, str]]) -> dict[str, Any]:
        prompt_n = sum(r.usage.prompt_tokens for r, _ in replies)
        gen_n = sum(r.usage.generated_tokens for r, _ in replies)
        cached = sum(r.usage.cached_tokens for r, _ in replies)
        return {
            "id": self._id(),
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.state.model,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "choices": [
                {
                    "index": i,
                    "text": (text if call.echo else "") + r.text,
                    "logprobs": self._probs(call, r.probs, "content") or None,
                    "finish_reason": _finish(r),
                }
                for i, (r, text) in enumerate(replies)
            ],
            "usage": {
                "completion_tokens": gen_n,
                "prompt_tokens": prompt_n,
                "total_tokens": prompt_n + gen_n,
                "prompt_tokens_details": {"cached_tokens": cached},
            },
            "timings": llama_timings(replies[-1][0]),
        }

    def _id(self) -> str:
        return "cmpl-" + self.state.next_id().removeprefix("chatcmpl-")

    async def _stream(
        self, rt: Runtime, call: CompletionCall, prompts: list[tuple[list[int], str]], send: Send, phase: Phase
    ) -> None:
        started = False
        ident, created = self._id(), int(time.time())
        for i, (tokens, text) in enumerate(prompts):
            items = cast(
                AsyncGenerator[Piece | Progress | Reply, None],
                rt.complete_prompt_stream(tokens, progress=call.return_progress, **self._options(call)),
            )
            async with contextlib.aclosing(items):
                try:
                    item = await anext(items)
                except Exception as e:
                    if not started:
                        raise
                    await self._event(send, {"error": json.loads(to_api_error(e).body())["error"]}, last=True)
                    return
                if not started:
                    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
                    started = True
                if self.oai and call.echo:
                    await self._event(send, self._oai_chunk(ident, created, i, text, None))
                clock = TokenClock(len(tokens))
                while not isinstance(item, Reply):
                    chunk = self._live(call, (ident, created, i), item, clock)
                    if chunk is not None:
                        await self._event(send, chunk)
                    item = await anext(items)
                if self.oai:
                    await self._event(send, self._oai_chunk(ident, created, i, "", _finish(item)))
                else:
                    await self._event(send, self._native(call, item, text, i, final=True))
        phase.ending = True
        tail = b"data: [DONE]\n\n" if self.oai else b""
        await send({"type": "http.response.body", "body": tail, "more_body": False})

    def _live(
        self, call: CompletionCall, at: tuple[str, int, int], item: Piece | Progress, clock: TokenClock
    ) -> dict[str, Any] | None:
        """The event for a streamed item (None: none): a piece of text (with its tokens' probabilities), or the
        prefill's progress; with `timings_per_token`, the timings so far."""
        ident, created, index = at
        extra: dict[str, Any] = {}
        probs: tuple[TokenProb, ...] = ()
        if isinstance(item, Progress):
            clock.start(item)
            text = ""
            extra["prompt_progress"] = progress_json(item)
        elif isinstance(item, str):
            probs = item.probs if isinstance(item, ProbText) else ()
            if not item and not probs:
                return None
            clock.piece(item)
            text = str(item)
        else:
            return None
        if call.timings_per_token:
            extra["timings"] = clock.timings()
        if self.oai:
            chunk = self._oai_chunk(ident, created, index, text, None)
            chunk["choices"][0]["logprobs"] = self._probs(call, probs, "content") or None
            return chunk | extra
        return {
            "index": index,
            "content": text,
            "tokens": [p.token for p in probs],
            "stop": False,
            "id_slot": 0,
            "tokens_predicted": clock.predicted,
            "tokens_evaluated": clock.prompt_tokens,
            **self._probs(call, probs, "completion_probabilities"),
            **extra,
        }

    def _oai_chunk(self, ident: str, created: int, index: int, text: str, finish: str | None) -> dict[str, Any]:
        return {
            "id": ident,
            "object": "text_completion",
            "created": created,
            "model": self.state.model,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "choices": [{"index": index, "text": text, "logprobs": None, "finish_reason": finish}],
        }

    @staticmethod
    async def _event(send: Send, data: dict[str, Any], *, last: bool = False) -> None:
        chunk = b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"
        await send({"type": "http.response.body", "body": chunk, "more_body": not last})


def llama_timings(reply: Reply) -> dict[str, Any]:
    """llama-server's `timings` of a completion: numbers only (a client checks each is finite and >= 0), the
    generation rate over the decode steps (the first token comes from the prompt's logits: n - 1 steps)."""
    out = {k: v for k, v in timings(reply).items() if isinstance(v, int | float) and not isinstance(v, bool)}
    steps, ms = max(0, out["predicted_n"] - 1), out["predicted_ms"]
    out["predicted_per_token_ms"] = ms / steps if steps else 0.0
    out["predicted_per_second"] = 1e3 / ms * steps if ms > 0 and steps else 0.0
    return out


async def _tokens(rt: Runtime, prompt: Prompt) -> tuple[list[int], str]:
    """The prompt's tokens (strings tokenized with BOS before the first, as llama-server) and its text."""
    tokens: list[int] = []
    for i, part in enumerate(prompt):
        if isinstance(part, str):
            tokens += await rt.tokenize(part, add_special=i == 0, parse_special=True)
        else:
            tokens.append(part)
    text = b"".join(await rt.token_pieces(tokens)).decode("utf-8", "replace")
    return tokens, text


def routes(state: ServeState, *, max_body_bytes: int, request_timeout: float | None) -> list[Route]:
    out = []
    for paths, oai in ((NATIVE_PATHS, False), (OAI_PATHS, True)):
        endpoint = CompletionEndpoint(state, oai=oai, max_body_bytes=max_body_bytes, request_timeout=request_timeout)
        out += [Route(p, endpoint, methods=["POST"]) for p in paths]
    return out
