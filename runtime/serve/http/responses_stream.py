"""The Responses API's event stream: `event: TYPE` / `data: {...}` server-sent events, numbered.

Order (OpenAI's): `response.created`, `response.in_progress`; per output item `response.output_item.added`,
then for a message `response.content_part.added`, `response.output_text.delta`s, `response.output_text.done`,
`response.content_part.done`; for reasoning `response.reasoning_text.delta`s and `.done`; for a function
call `response.function_call_arguments.delta` and `.done`; then `response.output_item.done`; finally
`response.completed` (or `response.incomplete`) with the whole response, or an `error` event. Every event
has a `sequence_number` (0, 1, 2 … in order), item events their `output_index` and `item_id`.

A turn that may call tools streams nothing until its reply is whole (the Runtime reads it whole), so its
items are sent at the end, each in one delta.
"""

from __future__ import annotations

from typing import Any

import msgspec

from runtime.serve.http import responses_convert as rc
from runtime.serve.http.errors import ApiError

__all__ = ["EventWriter"]

_encoder = msgspec.json.Encoder()


class EventWriter:
    """The events of one streamed response; `open` items are those added and not yet done."""

    def __init__(self, response: dict[str, Any]) -> None:
        self.response = response  # the response object in progress (status, output filled in at the end)
        self.seq = 0
        self.output: list[dict[str, Any]] = []
        self._kind: str | None = None  # the item being streamed: "reasoning" | "message"
        self._text = ""

    def event(self, kind: str, **fields: Any) -> bytes:
        body = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + _encoder.encode(body) + b"\n\n"

    def start(self) -> bytes:
        snapshot = {**self.response, "status": "in_progress", "output": []}
        return self.event("response.created", response=snapshot) + self.event("response.in_progress", response=snapshot)

    def piece(self, text: str, reasoning: bool) -> bytes:
        """A piece of the reply's reasoning or answer (opening its item first when it is new)."""
        kind = "reasoning" if reasoning else "message"
        out = b""
        if self._kind != kind:
            out += self._close()
            out += self._open(kind)
        self._text += text
        item = self._item()
        if kind == "reasoning":
            out += self.event(
                "response.reasoning_text.delta",
                item_id=item["id"],
                output_index=self._index,
                content_index=0,
                delta=text,
            )
        else:
            out += self.event(
                "response.output_text.delta",
                item_id=item["id"],
                output_index=self._index,
                content_index=0,
                delta=text,
                logprobs=[],
            )
        return out

    @property
    def _index(self) -> int:
        return len(self.output) - 1

    def _item(self) -> dict[str, Any]:
        return self.output[-1]

    def _open(self, kind: str) -> bytes:
        self._kind, self._text = kind, ""
        if kind == "reasoning":
            item = rc.reasoning_item(rc.new_id("rs"), "", "in_progress")
            self.output.append(item)
            return self.event("response.output_item.added", output_index=self._index, item=item)
        item = rc.message_item(rc.new_id("msg"), None, "in_progress")
        self.output.append(item)
        added = self.event("response.output_item.added", output_index=self._index, item=item)
        part = {"type": "output_text", "text": "", "annotations": []}
        return added + self.event(
            "response.content_part.added", item_id=item["id"], output_index=self._index, content_index=0, part=part
        )

    def _close(self) -> bytes:
        """Finish the item being streamed (its done events)."""
        if self._kind is None:
            return b""
        item, i, text = self._item(), self._index, self._text
        out = b""
        if self._kind == "reasoning":
            done = rc.reasoning_item(item["id"], text, "completed")
            out += self.event(
                "response.reasoning_text.done", item_id=item["id"], output_index=i, content_index=0, text=text
            )
        else:
            done = rc.message_item(item["id"], text, "completed")
            out += self.event(
                "response.output_text.done", item_id=item["id"], output_index=i, content_index=0, text=text, logprobs=[]
            )
            out += self.event(
                "response.content_part.done",
                item_id=item["id"],
                output_index=i,
                content_index=0,
                part=rc.text_part(text),
            )
        self.output[i] = done
        self._kind = None
        return out + self.event("response.output_item.done", output_index=i, item=done)

    def end(self, final: dict[str, Any]) -> bytes:
        """The remaining items of the final response (those not streamed), then `response.completed`.

        `final["output"]` is the reply's output as the non-streamed response has it; the streamed items keep
        their ids, so the completed response lists exactly the items the stream announced."""
        out = self._close()
        streamed = {item["type"]: item for item in self.output}
        output: list[dict[str, Any]] = []
        for item in final["output"]:
            if item["type"] in ("reasoning", "message") and item["type"] in streamed:
                output.append(streamed[item["type"]])
                continue
            i = len(self.output)
            if item["type"] == "function_call":
                pending = rc.function_item(item["id"], item["call_id"], item["name"], "", "in_progress")
                self.output.append(pending)
                out += self.event("response.output_item.added", output_index=i, item=pending)
                args = item["arguments"]
                out += self.event(
                    "response.function_call_arguments.delta", item_id=item["id"], output_index=i, delta=args
                )
                out += self.event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=i,
                    name=item["name"],
                    arguments=args,
                )
                self.output[i] = item
                out += self.event("response.output_item.done", output_index=i, item=item)
            else:  # a message or reasoning the stream did not carry (an empty reply; a tools turn's text)
                self.output.append(item)
                out += self._whole(i, item)
            output.append(item)
        final["output"] = output
        kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
        return out + self.event(kind, response=final)

    def _whole(self, i: int, item: dict[str, Any]) -> bytes:
        """A whole message or reasoning item's events at once."""
        if item["type"] == "reasoning":
            text = rc.text_of([]) if not item["content"] else item["content"][0]["text"]
            pending = rc.reasoning_item(item["id"], "", "in_progress")
            out = self.event("response.output_item.added", output_index=i, item=pending)
            out += self.event(
                "response.reasoning_text.delta", item_id=item["id"], output_index=i, content_index=0, delta=text
            )
            out += self.event(
                "response.reasoning_text.done", item_id=item["id"], output_index=i, content_index=0, text=text
            )
            return out + self.event("response.output_item.done", output_index=i, item=item)
        text = item["content"][0]["text"] if item["content"] else ""
        pending = rc.message_item(item["id"], None, "in_progress")
        out = self.event("response.output_item.added", output_index=i, item=pending)
        part = {"type": "output_text", "text": "", "annotations": []}
        out += self.event("response.content_part.added", item_id=item["id"], output_index=i, content_index=0, part=part)
        if text:
            out += self.event(
                "response.output_text.delta",
                item_id=item["id"],
                output_index=i,
                content_index=0,
                delta=text,
                logprobs=[],
            )
        out += self.event(
            "response.output_text.done", item_id=item["id"], output_index=i, content_index=0, text=text, logprobs=[]
        )
        out += self.event(
            "response.content_part.done", item_id=item["id"], output_index=i, content_index=0, part=rc.text_part(text)
        )
        return out + self.event("response.output_item.done", output_index=i, item=item)

    def error(self, err: ApiError) -> bytes:
        return self.event("error", code=err.code or err.type, message=err.message, param=err.param)
