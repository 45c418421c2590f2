"""The Anthropic Messages stream: `event: NAME\\ndata: {json}\\n\\n` events in Anthropic's order.

    message_start (usage 0: the counts come with message_delta), ping,
    per block: content_block_start, content_block_delta..., content_block_stop
        (thinking: thinking_delta pieces, then one signature_delta with signature ""; text: text_delta;
         tool_use: one input_json_delta with the whole arguments),
    message_delta (stop_reason, stop_sequence, usage with input, cache-read and output tokens), message_stop.

Blocks get indices 0, 1, … in the order they open: a thinking block, then a text block, then one block
per tool call, the same blocks as the unstreamed message. A reply whose text was not streamed (a turn
that may call tools is read whole) has its thinking and text sent as blocks at the end. An error after
the stream started is an `error` event, the last one.
"""

from __future__ import annotations

from typing import Any

import msgspec

from runtime.reasoning import Reasoning
from runtime.reply import Reply
from runtime.serve.http import anthropic
from runtime.serve.http.errors import ApiError

__all__ = ["MessageEvents"]

_encoder = msgspec.json.Encoder()


def event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + _encoder.encode({"type": name, **data}) + b"\n\n"


class MessageEvents:
    """Builds the events of one streamed message."""

    def __init__(self, message_id: str, model: str) -> None:
        self.id = message_id
        self.model = model
        self._index = -1
        self._open: str | None = None  # the kind of the block being streamed ("thinking", "text")
        self._streamed = False

    def start(self) -> bytes:
        message: dict[str, Any] = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return event("message_start", {"message": message}) + event("ping", {})

    def _begin(self, block: dict[str, Any]) -> bytes:
        self._index += 1
        return event("content_block_start", {"index": self._index, "content_block": block})

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return event("content_block_delta", {"index": self._index, "delta": delta})

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        out = self._delta({"type": "signature_delta", "signature": ""}) if self._open == "thinking" else b""
        self._open = None
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
        if kind == "thinking":
            return out + self._delta({"type": "thinking_delta", "thinking": text})
        return out + self._delta({"type": "text_delta", "text": text})

    def piece(self, text: str) -> bytes:
        """A streamed piece: `Reasoning` pieces go to the thinking block, the answer to the text block."""
        if not text:
            return b""
        self._streamed = True
        return self._text("thinking" if isinstance(text, Reasoning) else "text", str(text))

    def end(self, reply: Reply) -> bytes:
        """The closing events: blocks not streamed, tool calls, message_delta and message_stop."""
        out = b""
        if not self._streamed:
            if reply.reasoning:
                out += self._text("thinking", reply.reasoning)
            if reply.text:
                out += self._text("text", reply.text)
        out += self._close()
        for block in anthropic.tool_use_blocks(reply):
            out += self._begin({**block, "input": {}})
            out += self._delta({"type": "input_json_delta", "partial_json": _encoder.encode(block["input"]).decode()})
            out += event("content_block_stop", {"index": self._index})
        reason = anthropic.stop_reason(reply)
        delta = {"stop_reason": reason, "stop_sequence": reply.stop_sequence if reason == "stop_sequence" else None}
        out += event("message_delta", {"delta": delta, "usage": anthropic.usage(reply)})
        return out + event("message_stop", {})

    @staticmethod
    def error(err: ApiError) -> bytes:
        return event("error", {"error": {"type": err.anthropic_type(), "message": err.message}})
