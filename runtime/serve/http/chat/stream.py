"""Server-sent events for streamed chat completions: `data: {chunk}\\n\\n` events, then `data: [DONE]\\n\\n`.

The first chunk carries the assistant role alone (as OpenAI's and llama-server's); the last one the finish reason and
llama-server's `timings`; with `stream_options.include_usage` one more chunk (no choices) carries the usage.
Tool calls stream as OpenAI's `delta.tool_calls` as the Runtime's `ToolCallDelta` pieces come: a call's first
chunk has its id, type and name with arguments "", the next ones arguments text (a reply whose calls came in
no piece sends them whole before the finish). An error after the stream has started is sent as a
`data: {"error": ...}` event.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from runtime.reasoning import Reasoning
from runtime.reply import ProbText, Progress, Reply, Started
from runtime.reply import ToolCallDelta as CallPiece
from runtime.serve.http.chat import convert
from runtime.serve.http.chat.schema import Chunk, ChunkChoice, Delta, FunctionDelta, ToolCallDelta
from runtime.serve.http.errors import ApiError
from runtime.serve.http.llama.live import TokenClock, progress_json
from runtime.serve.http.llama.options import SYSTEM_FINGERPRINT

__all__ = ["DONE", "ChunkWriter"]

DONE = b"data: [DONE]\n\n"
_encoder = msgspec.json.Encoder()


def event(body: msgspec.Struct) -> bytes:
    return b"data: " + _encoder.encode(body) + b"\n\n"


class ChunkWriter:
    """Builds the events of one stream (same id, model and creation time on every chunk)."""

    def __init__(self, request_id: str, model: str, call: convert.Call | None = None) -> None:
        self.call = call
        self.clock = TokenClock() if call is not None and (call.timings_per_token or call.return_progress) else None
        self.id = request_id
        self.model = model
        self.created = int(time.time())
        self._role_sent = False
        self._calls_sent = False

    def _chunk(
        self,
        delta: Delta,
        finish: str | None = None,
        timings: dict[str, Any] | None = None,
        logprobs: dict[str, Any] | None = None,
        progress: dict[str, Any] | None = None,
    ) -> bytes:
        choice = ChunkChoice(index=0, delta=delta, finish_reason=finish, logprobs=logprobs)
        per_token = self.clock is not None and self.call is not None and self.call.timings_per_token
        if timings is None and per_token and self._role_sent and self.clock is not None and self.clock.t_first:
            timings = self.clock.timings()
        return event(
            Chunk(
                id=self.id,
                created=self.created,
                model=self.model,
                choices=[choice],
                timings=msgspec.UNSET if timings is None else timings,
                system_fingerprint=SYSTEM_FINGERPRINT,
                prompt_progress=msgspec.UNSET if progress is None else progress,
            )
        )

    def progress(self, item: Started) -> bytes:
        """llama-server's prompt-progress chunk: the assistant role and `prompt_progress` (a `Progress` report)."""
        if not isinstance(item, Progress):
            return b""
        if self.clock is not None:
            self.clock.start(item)
        return self._chunk(Delta(role="assistant", content=None), progress=progress_json(item))

    def opening(self, started: Started | None = None) -> bytes:
        """The first event: the assistant role and nothing else (whether or not the slot announced the turn
        first: `started`)."""
        self._role_sent = True
        if started is not None and self.clock is not None:
            self.clock.start(started)
        return self._chunk(Delta(role="assistant", content=None))

    def _role(self) -> str | None:
        if self._role_sent:
            return None
        self._role_sent = True
        return "assistant"

    def piece(self, text: str | CallPiece) -> bytes:
        """A streamed piece: `Reasoning` pieces are `delta.reasoning_content`, the answer `delta.content`, a
        `ToolCallDelta` one entry of `delta.tool_calls`."""
        if isinstance(text, CallPiece):
            self._calls_sent = True
            if text.id:  # the call's first piece
                delta = ToolCallDelta(
                    index=text.index, id=text.id, type="function", function=FunctionDelta(name=text.name, arguments="")
                )
            else:
                delta = ToolCallDelta(index=text.index, function=FunctionDelta(arguments=text.arguments_delta))
            return self._chunk(Delta(role=self._role(), tool_calls=[delta]))
        if self.clock is not None:
            self.clock.piece(text)
        if isinstance(text, Reasoning):
            return self._chunk(Delta(role=self._role(), reasoning_content=str(text)))
        logprobs = None
        if isinstance(text, ProbText) and self.call is not None:  # the probabilities of the tokens that made it
            logprobs = convert.logprobs(text.probs, self.call)
        return self._chunk(Delta(role=self._role(), content=str(text)), logprobs=logprobs)

    def end(self, reply: Reply, *, include_usage: bool) -> bytes:
        """The closing events: tool calls (if any), the finish reason with timings, the usage, [DONE]."""
        out = b""
        role = self._role()
        calls = convert.tool_calls(reply)
        if calls and not self._calls_sent:
            deltas = [
                ToolCallDelta(
                    index=i,
                    id=c.id,
                    type="function",
                    function=FunctionDelta(name=c.function.name, arguments=c.function.arguments),
                )
                for i, c in enumerate(calls)
            ]
            out += self._chunk(Delta(role=role, tool_calls=deltas))
            role = None
        elif role is not None:
            out += self._chunk(Delta(role=role, content=""))
        out += self._chunk(Delta(), convert.finish_reason(reply), timings=convert.timings(reply))
        if include_usage:
            out += event(
                Chunk(
                    id=self.id,
                    created=self.created,
                    model=self.model,
                    choices=[],
                    usage=convert.usage(reply),
                    timings=convert.timings(reply) if self.clock is not None else msgspec.UNSET,
                    system_fingerprint=SYSTEM_FINGERPRINT,
                )
            )
        return out + DONE

    @staticmethod
    def error(err: ApiError) -> bytes:
        return b"data: " + err.body() + b"\n\n"
