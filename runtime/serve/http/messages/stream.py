"""The Anthropic Messages stream: `event: NAME\\ndata: {json}\\n\\n` events in Anthropic's order.

    message_start (sent when the slot starts the turn, with the prompt's input and cache-read tokens), ping
    (and one more every keep-alive interval while nothing else is sent),
    per block: content_block_start, content_block_delta..., content_block_stop
        (thinking: thinking_delta pieces, then one signature_delta with signature ""; text: text_delta;
         tool_use: started with `input` {}, then input_json_delta pieces as the Runtime's `ToolCallDelta`
         pieces come),
    message_delta (stop_reason, stop_sequence, usage with input, cache-read and output tokens), message_stop.

Blocks get indices 0, 1, … in the order they open, one open at a time: a thinking block, then a text block,
then one block per tool call, the same blocks as the unstreamed message. A call's partial_json pieces add up
to the JSON text of its `input` (`json.dumps(arguments, ensure_ascii=False)`), so the client's assembled
message equals the unstreamed one. Answer text that comes after a call has started is not streamed (the
text block goes before the calls); what the reply has and no piece said (a turn with no pieces) is sent
as whole blocks at the end. An error after the stream started is an `error` event, the last one.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from runtime.log import get_logger
from runtime.reasoning import Reasoning
from runtime.reply import Reply, Started, ToolCallDelta
from runtime.serve.http.errors import ApiError
from runtime.serve.http.messages import convert as anthropic
from runtime.tools.calls import canonical_arguments

__all__ = ["MessageEvents"]

log = get_logger(__name__)

_encoder = msgspec.json.Encoder()


def event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + _encoder.encode({"type": name, **data}) + b"\n\n"


class MessageEvents:
    """Builds the events of one streamed message."""

    def __init__(self, message_id: str, model: str) -> None:
        self.id = message_id
        self.model = model
        self._index = -1
        self._open: str | None = None  # the kind of the block being streamed ("thinking", "text", "tool_use")
        self._said: set[str] = set()  # the kinds of text blocks streamed ("thinking", "text")
        self._calls: dict[int, tuple[str, str]] = {}  # a call's index in the reply -> (id, arguments said)
        self._call: int | None = None  # the index (in the reply) of the call being streamed
        self._late = ""  # answer text that came after a call had started (not streamed)

    def start(self, started: Started | None = None) -> bytes:
        """message_start (the prompt's token counts when the slot started the turn: `started`) and a ping."""
        usage = {"input_tokens": 0, "output_tokens": 0}
        if started is not None:  # the split of the final usage: input is what is not read from the cache
            usage = {
                "input_tokens": started.prompt_tokens - started.cached_tokens,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": started.cached_tokens,
                "output_tokens": 0,
            }
        message: dict[str, Any] = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage,
        }
        return event("message_start", {"message": message}) + self.ping()

    def ping(self) -> bytes:
        """Anthropic's keep-alive event."""
        return event("ping", {})

    def _begin(self, block: dict[str, Any]) -> bytes:
        self._index += 1
        return event("content_block_start", {"index": self._index, "content_block": block})

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return event("content_block_delta", {"index": self._index, "delta": delta})

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        out = self._delta({"type": "signature_delta", "signature": ""}) if self._open == "thinking" else b""
        self._open = self._call = None
        return out + event("content_block_stop", {"index": self._index})

    def _text(self, kind: str, text: str) -> bytes:
        out = b""
        if kind != self._open:
            out += self._close()
            out += self._begin(
                {"type": "thinking", "thinking": "", "signature": ""}
                if kind == "thinking"
                else {"type": "text", "text": ""}
            )
            self._open = kind
            self._said.add(kind)
        if kind == "thinking":
            return out + self._delta({"type": "thinking_delta", "thinking": text})
        return out + self._delta({"type": "text_delta", "text": text})

    def piece(self, piece: str | ToolCallDelta) -> bytes:
        """A streamed piece: `Reasoning` pieces go to the thinking block, the answer to the text block, a
        `ToolCallDelta` to its call's tool_use block."""
        if isinstance(piece, ToolCallDelta):
            return self._tool(piece)
        if not piece:
            return b""
        if isinstance(piece, Reasoning):
            return self._text("thinking", str(piece))
        if self._calls:
            self._late += piece
            return b""
        return self._text("text", piece)

    def _tool(self, piece: ToolCallDelta) -> bytes:
        if piece.id:  # the call's first piece: its block
            out = self._close()
            self._calls[piece.index] = (piece.id, "")
            self._open, self._call = "tool_use", piece.index
            return out + self._begin({"type": "tool_use", "id": piece.id, "name": piece.name, "input": {}})
        if piece.index != self._call:  # a piece of a call already done (the Runtime's pieces never do that)
            log.warning("messages.stream_call_piece_dropped", index=piece.index)
            return b""
        call_id, said = self._calls[piece.index]
        self._calls[piece.index] = (call_id, said + piece.arguments_delta)
        return self._delta({"type": "input_json_delta", "partial_json": piece.arguments_delta})

    def end(self, reply: Reply) -> bytes:
        """The closing events: blocks no piece said, message_delta and message_stop."""
        out = self._close()
        if reply.reasoning and "thinking" not in self._said:
            out += self._text("thinking", reply.reasoning) + self._close()
        if reply.text and "text" not in self._said:
            out += self._text("text", reply.text) + self._close()
        elif self._late:
            log.warning("messages.stream_text_after_call", held=len(self._late))
        said = {call_id: args for call_id, args in self._calls.values()}
        for block in anthropic.tool_use_blocks(reply):
            if block["id"] in said:
                if _decoded(said[block["id"]]) != block["input"]:
                    log.warning("messages.stream_call_diverged", id=block["id"])
                continue
            out += self._begin({**block, "input": {}})
            out += self._delta({"type": "input_json_delta", "partial_json": canonical_arguments(block["input"])})
            out += event("content_block_stop", {"index": self._index})
        reason = anthropic.stop_reason(reply)
        delta = {"stop_reason": reason, "stop_sequence": reply.stop_sequence if reason == "stop_sequence" else None}
        out += event("message_delta", {"delta": delta, "usage": anthropic.usage(reply)})
        return out + event("message_stop", {})

    @staticmethod
    def error(err: ApiError) -> bytes:
        return event("error", {"error": {"type": err.anthropic_type(), "message": err.message}})


def _decoded(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None
