"""The Responses API's event stream: `event: TYPE` / `data: {...}` server-sent events, numbered.

Order (OpenAI's): `response.created`, `response.in_progress`; per output item `response.output_item.added`,
then for a message `response.content_part.added`, `response.output_text.delta`s, `response.output_text.done`,
`response.content_part.done`; for reasoning `response.reasoning_text.delta`s and `.done`; for a function
call (added with `arguments` "" and status `in_progress`) `response.function_call_arguments.delta`s as the
Runtime's `ToolCallDelta` pieces come, then `.done` with the whole arguments; then `response.output_item.done`;
finally `response.completed` (or `response.incomplete`) with the whole response, or an `error` event. Every
event has a `sequence_number` (0, 1, 2 … in order), item events their `output_index` and `item_id`.

Invariants: items are streamed one at a time (an item is done before the next is added); the completed
response's `output[i]` is the item announced with `output_index` i (with the final reply's content, under the
streamed id), so the output equals the non-streamed one whenever the stream's order is the reply's
(reasoning, message, calls: always, except answer text the model writes between two calls); a call's
argument deltas add up to its `arguments`, `json.dumps(arguments, ensure_ascii=False)` as the non-streamed
response has them. Answer text that comes after a call has started is not streamed (the message goes before
the calls); the completed response carries it. What the reply has and the pieces did not say (no pieces
at all) is sent whole at the end, after the streamed items.
"""

from __future__ import annotations

from typing import Any

import msgspec

from runtime.log import get_logger
from runtime.reasoning import Reasoning
from runtime.reply import ProbText, Progress, Started, ToolCallDelta
from runtime.serve.http.errors import ApiError
from runtime.serve.http.llama.live import TokenClock, progress_json
from runtime.serve.http.responses import convert as rc

__all__ = ["EventWriter"]

log = get_logger(__name__)

_encoder = msgspec.json.Encoder()


class EventWriter:
    """The events of one streamed response. `output` holds the items announced, by output index."""

    def __init__(self, response: dict[str, Any], top_logprobs: int | None = None, *, live: bool = False) -> None:
        self.top = top_logprobs  # logprobs asked: alternatives per token (None: not asked)
        self.clock = TokenClock() if live else None  # llama-server's timings_per_token / return_progress
        self.response = response  # the response object in progress (status, output filled in at the end)
        self.seq = 0
        self.output: list[dict[str, Any]] = []
        self._open: int | None = None  # the output index of the item being streamed
        self._text: dict[int, str] = {}  # per streamed item: its text (reasoning, message) or arguments
        self._calls: dict[int, int] = {}  # a call's index in the reply -> its output index
        self._late = ""  # answer text that came after a call had started (not streamed)

    def event(self, kind: str, **fields: Any) -> bytes:
        body = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + _encoder.encode(body) + b"\n\n"

    def progress(self, item: Started) -> bytes:
        """llama-server's `response.in_progress` event with `prompt_progress` (a prefill `Progress` report)."""
        if not isinstance(item, Progress):
            return b""
        extra: dict[str, Any] = {"prompt_progress": progress_json(item)}
        if self.clock is not None:
            self.clock.start(item)
            extra["timings"] = self.clock.timings()
        snapshot = {**self.response, "status": "in_progress", "output": []}
        return self.event("response.in_progress", response=snapshot, **extra)

    def start(self, started: Started | None = None) -> bytes:
        """response.created and response.in_progress (sent as soon as the slot starts the turn)."""
        snapshot = {**self.response, "status": "in_progress", "output": []}
        return self.event("response.created", response=snapshot) + self.event("response.in_progress", response=snapshot)

    def piece(self, piece: str | ToolCallDelta) -> bytes:
        """The events of one streamed piece: reasoning (`Reasoning`), answer text (`str`) or a call's piece."""
        if isinstance(piece, ToolCallDelta):
            return self._call(piece)
        if not piece:
            return b""
        kind = "reasoning" if isinstance(piece, Reasoning) else "message"
        text = str(piece)
        if kind == "message" and self._calls:
            self._late += text
            return b""
        out = b""
        if self._open is None or self.output[self._open]["type"] != kind:
            out += self._close()
            out += self._add(kind)
        i = self._open
        assert i is not None
        self._text[i] += text
        item_id = self.output[i]["id"]
        if kind == "reasoning":
            return out + self.event(
                "response.reasoning_text.delta", item_id=item_id, output_index=i, content_index=0, delta=text
            )
        probs = rc.logprobs(piece.probs, self.top) if isinstance(piece, ProbText) else []
        extra: dict[str, Any] = {}
        if self.clock is not None:
            self.clock.piece(piece)
            extra["timings"] = self.clock.timings()
        return out + self.event(
            "response.output_text.delta",
            item_id=item_id,
            output_index=i,
            content_index=0,
            delta=text,
            logprobs=probs,
            **extra,
        )

    def _call(self, piece: ToolCallDelta) -> bytes:
        if piece.id:  # the call's first piece: its item
            out = self._close()
            i = len(self.output)
            item = rc.function_item(rc.new_id("fc"), piece.id, piece.name, "", "in_progress")
            self.output.append(item)
            self._calls[piece.index] = self._open = i
            self._text[i] = ""
            return out + self.event("response.output_item.added", output_index=i, item=item)
        i = self._calls.get(piece.index, -1)
        if i != self._open:  # a piece of a call already done (the Runtime's pieces never do that)
            log.warning("responses.stream_call_piece_dropped", index=piece.index)
            return b""
        self._text[i] += piece.arguments_delta
        return self.event(
            "response.function_call_arguments.delta",
            item_id=self.output[i]["id"],
            output_index=i,
            delta=piece.arguments_delta,
        )

    def _add(self, kind: str) -> bytes:
        i = len(self.output)
        self._open = i
        self._text[i] = ""
        if kind == "reasoning":
            item = rc.reasoning_item(rc.new_id("rs"), "", "in_progress")
            self.output.append(item)
            return self.event("response.output_item.added", output_index=i, item=item)
        item = rc.message_item(rc.new_id("msg"), None, "in_progress")
        self.output.append(item)
        added = self.event("response.output_item.added", output_index=i, item=item)
        part = {"type": "output_text", "text": "", "annotations": []}
        return added + self.event(
            "response.content_part.added", item_id=item["id"], output_index=i, content_index=0, part=part
        )

    def _close(self, status: str = "completed") -> bytes:
        """Finish the item being streamed (its done events); `status` is a call's (`incomplete`: cut)."""
        i = self._open
        if i is None:
            return b""
        self._open = None
        item, text = self.output[i], self._text[i]
        if item["type"] == "function_call":
            done = rc.function_item(item["id"], item["call_id"], item["name"], text, status)
            out = self.event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=i,
                name=item["name"],
                arguments=text,
            )
        elif item["type"] == "reasoning":
            done = rc.reasoning_item(item["id"], text, "completed")
            out = self.event(
                "response.reasoning_text.done", item_id=item["id"], output_index=i, content_index=0, text=text
            )
        else:
            done = rc.message_item(item["id"], text, "completed")
            out = self.event(
                "response.output_text.done", item_id=item["id"], output_index=i, content_index=0, text=text, logprobs=[]
            )
            part = rc.text_part(text)
            out += self.event(
                "response.content_part.done", item_id=item["id"], output_index=i, content_index=0, part=part
            )
        self.output[i] = done
        return out + self.event("response.output_item.done", output_index=i, item=done)

    def _match(self, item: dict[str, Any], used: set[int]) -> int | None:
        """The output index of the streamed item that is the final `item` (a call by its call id)."""
        for i, streamed in enumerate(self.output):
            if i in used or streamed["type"] != item["type"]:
                continue
            if item["type"] != "function_call" or streamed["call_id"] == item["call_id"]:
                return i
        return None

    def end(self, final: dict[str, Any], timings: dict[str, Any] | None = None) -> bytes:
        """The last events: the open item's done events, the final items no piece announced, then
        `response.completed` (or `.incomplete`) with `final`, whose output becomes the streamed one.

        `final["output"]` is the reply's output as the non-streamed response has it (fresh ids)."""
        status = "completed"
        if self._open is not None and self.output[self._open]["type"] == "function_call":
            call_id = self.output[self._open]["call_id"]
            if not any(o["type"] == "function_call" and o["call_id"] == call_id for o in final["output"]):
                status = "incomplete"  # a call the reply does not have: cut by max_output_tokens
        out = self._close(status)
        used: set[int] = set()
        for item in final["output"]:
            j = self._match(item, used)
            if j is None:  # not streamed: sent whole now, after the streamed items
                j = len(self.output)
                self.output.append(item)
                out += self._whole(j, item)
            else:
                merged = {**item, "id": self.output[j]["id"]}
                if merged != self.output[j] and not self._late:
                    log.warning("responses.stream_diverged", output_index=j, type=item["type"])
                self.output[j] = merged
            used.add(j)
        final["output"] = list(self.output)
        kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
        return out + self.event(kind, response=final, **({"timings": timings} if timings is not None else {}))

    def _whole(self, i: int, item: dict[str, Any]) -> bytes:
        """A whole item's events at once (one delta with all its text or arguments)."""
        if item["type"] == "function_call":
            args = item["arguments"]
            pending = rc.function_item(item["id"], item["call_id"], item["name"], "", "in_progress")
            out = self.event("response.output_item.added", output_index=i, item=pending)
            out += self.event("response.function_call_arguments.delta", item_id=item["id"], output_index=i, delta=args)
            out += self.event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=i,
                name=item["name"],
                arguments=args,
            )
            return out + self.event("response.output_item.done", output_index=i, item=item)
        if item["type"] == "reasoning":
            text = item["content"][0]["text"] if item["content"] else ""
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
