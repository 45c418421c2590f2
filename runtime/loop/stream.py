"""Streaming: pieces handed from the worker thread to an async consumer without blocking the thread.

`Pieces` is the queue: text pieces (`str`, `runtime.Reasoning` for reasoning) and, on a turn that may call
tools, `ToolCallDelta` pieces. `CallStream` makes those pieces for a turn with tools: it reads the answer so
far with the tool format's `parse_partial` after every piece and sends what changed (new content, a new call,
more of a call's arguments), so answer text streams as it is generated (the format holds back only what may
still become a call opener) and calls stream as they are written. At the end `CallStream.finish` sends
whatever the final reply has that the pieces did not yet say and gives the reply's calls the ids the pieces
announced: the pieces always add up to the final Reply (content, and each call's id, name and arguments text
`json.dumps(arguments, ensure_ascii=False)`).
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence

import anyio
import msgspec

from runtime.log import get_logger
from runtime.loop.notify import Signal
from runtime.loop.scheduler import Job, Scheduler
from runtime.reasoning import Reasoning
from runtime.reply import Progress, Reply, Started, ToolCallDelta
from runtime.tools import new_call_id
from runtime.tools.calls import PartialReply
from sessions.model import ToolCall

__all__ = ["CallStream", "Piece", "Pieces", "follow"]

log = get_logger(__name__)

Piece = str | ToolCallDelta  # what a stream yields before its Reply (`Reasoning` is a `str`)


class Pieces:
    """A queue of pieces: the worker thread pushes, the consumer is woken on the event loop. With
    `progress`, a `Started` item comes first, when the slot starts the turn (`started`)."""

    def __init__(self, *, progress: bool = False, prefill: bool = False) -> None:
        self.items: deque[Piece | Started] = deque()
        self.signal = Signal()
        self.progress = progress
        self.prefill = prefill  # `Progress` reports of the prefill too (llama-server's return_progress)
        self._t0 = 0.0
        self._cached = 0

    def started(self, prompt_tokens: int, cached_tokens: int) -> None:  # worker thread: before the prefill
        self._t0, self._cached = time.perf_counter(), cached_tokens
        if self.progress:
            self.push(Started(prompt_tokens, cached_tokens))

    def prefilled(self, done: int, total: int) -> None:  # worker thread: the prefill's start and each chunk
        if self.prefill:
            self.push(Progress(total, self._cached, processed=done, seconds=time.perf_counter() - self._t0))

    def push(self, piece: Piece | Started) -> None:  # worker thread (or the loop: the wake-up is thread-safe)
        self.items.append(piece)
        self.signal.fire_from_thread()

    def feed(self, parts: Sequence[str]) -> None:
        """Text pieces as the reasoning split gives them, passed on as they are."""
        for part in parts:
            self.push(part)


Reader = Callable[[str], PartialReply]  # the answer so far -> what it says so far


class CallStream:
    """The pieces of a turn that may call tools: reasoning passes through, the answer is read by `read`
    (`format.parse_partial(answer, tools)`; None: nothing is streamed until `finish`)."""

    def __init__(self, out: Pieces, read: Reader | None) -> None:
        self.out = out
        self.read = read
        self.answer = ""  # the answer text so far (what `read` reads)
        self.content = ""  # the content the pieces said
        self.calls: list[list[str]] = []  # per call: [id, name, arguments text said]

    def started(self, prompt_tokens: int, cached_tokens: int) -> None:  # worker thread
        self.out.started(prompt_tokens, cached_tokens)

    def prefilled(self, done: int, total: int) -> None:  # worker thread
        self.out.prefilled(done, total)

    def feed(self, parts: Sequence[str]) -> None:  # worker thread
        grew = False
        for part in parts:
            if isinstance(part, Reasoning):
                self.out.push(part)
            elif part:
                self.answer += part
                grew = True
        if grew and self.read is not None:
            self._say(self.read(self.answer))

    def _say(self, partial: PartialReply) -> None:
        if partial.content.startswith(self.content) and len(partial.content) > len(self.content):
            self.out.push(partial.content[len(self.content) :])
            self.content = partial.content
        for i, call in enumerate(partial.calls):
            if i == len(self.calls):
                self._open(i, call.id or new_call_id(), call.name)
            said = self.calls[i]
            if call.arguments.startswith(said[2]) and len(call.arguments) > len(said[2]):
                self.out.push(ToolCallDelta(i, arguments_delta=call.arguments[len(said[2]) :]))
                said[2] = call.arguments

    def _open(self, index: int, call_id: str, name: str) -> None:
        self.out.push(ToolCallDelta(index, id=call_id, name=name))
        self.calls.append([call_id, name, ""])

    def finish(self, text: str, calls: Sequence[ToolCall]) -> tuple[ToolCall, ...]:
        """Send what the final reply (`text`, `calls`) has beyond the pieces; return the calls with the ids the
        pieces announced. A reply the pieces contradict (a reading that was not a prefix of the end: a format
        bug) is logged; the Reply stands."""
        if text.startswith(self.content):
            if len(text) > len(self.content):
                self.out.push(text[len(self.content) :])
        else:
            log.warning("stream.content_diverged", said=len(self.content), final=len(text))
        out: list[ToolCall] = []
        for i, call in enumerate(calls):
            if i == len(self.calls):
                self._open(i, call.id, call.name)
            call_id, name, said = self.calls[i]
            arguments = json.dumps(call.arguments, ensure_ascii=False)
            if name != call.name or not arguments.startswith(said):
                log.warning("stream.call_diverged", index=i, name=call.name, said=len(said), final=len(arguments))
            elif len(arguments) > len(said):
                self.out.push(ToolCallDelta(i, arguments_delta=arguments[len(said) :]))
            out.append(call if call.id == call_id else msgspec.structs.replace(call, id=call_id))
        if len(self.calls) > len(calls):
            log.warning("stream.calls_diverged", said=len(self.calls), final=len(calls))
        return tuple(out)


async def follow(
    scheduler: Scheduler, job: Job[Reply], pieces: Pieces, timeout: float | None
) -> AsyncIterator[Piece | Started | Reply]:
    """Yield a job's pieces as they come, then its Reply. A consumer that stops before it got the Reply
    (closed the iterator, was cancelled, timed out) withdraws the job: it is stopped and nothing is committed."""
    job.watchers.append(pieces.signal.fire)
    deadline = None if timeout is None else time.monotonic() + timeout
    delivered = False
    try:
        while True:
            while pieces.items:
                yield pieces.items.popleft()
            if job.done.is_set():
                break
            with anyio.move_on_after(None if deadline is None else max(0.0, deadline - time.monotonic())):
                await pieces.signal.wait()
                continue
            break  # the deadline passed
        while pieces.items:
            yield pieces.items.popleft()
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        reply = await scheduler.wait(job, remaining)
        delivered = True
        yield reply
    finally:
        if not delivered:
            with anyio.CancelScope(shield=True):
                await scheduler.withdraw(job, "stream closed")
