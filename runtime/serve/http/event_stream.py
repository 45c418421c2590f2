"""Sending a turn's pieces as server-sent events (shared by chat completions, Messages and Responses).

The rule every streaming endpoint keeps: an error before the stream starts gets its own status (the caller's
error response: nothing has been sent yet); once the 200 has gone out, an error is the dialect's error event
that ends the stream. The stream starts with the first item: the turn's `Started` (the slot took it, its
prompt fits: errors such as a full queue or a prompt too long came before) or its first piece. So a long
prefill does not leave the client without bytes: the opening event goes out at once (Anthropic's
`message_start` with the prompt's token counts, Responses' `response.created`, an SSE comment for chat
completions), and while nothing else comes a keep-alive is sent every `keepalive` seconds (Anthropic's
`ping`, an SSE comment line `: keep-alive` elsewhere), so no client's idle timeout fires. Each dialect
brings a writer (its events for a piece, a keep-alive and an error) and its end.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol, TypeVar

import anyio
import anyio.abc

from runtime.reply import Reply, Started, ToolCallDelta
from runtime.serve.asgi import Send
from runtime.serve.http.errors import ApiError, to_api_error
from runtime.serve.http.watch import Phase

__all__ = ["KEEPALIVE_SECONDS", "SSE_HEADERS", "PieceWriter", "relay"]

KEEPALIVE_SECONDS = 10.0
SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
COMMENT = b": keep-alive\n\n"  # an SSE comment: clients skip it, the connection sees bytes


class PieceWriter(Protocol):
    def piece(self, piece: str | ToolCallDelta, /) -> bytes: ...

    def error(self, err: ApiError, /) -> bytes: ...


W = TypeVar("W", bound=PieceWriter)
Item = str | ToolCallDelta | Started | Reply


class _Failed:
    def __init__(self, exc: Exception) -> None:
        self.exc = exc


async def relay(
    items: AsyncIterator[Item],
    send: Send,
    make: Callable[[], W],
    end: Callable[[W, Reply], Awaitable[bytes]],
    *,
    opening: Callable[[W, Started | None], bytes] | None = None,
    keepalive_event: Callable[[W], bytes] | None = None,
    progress: Callable[[W, Started], bytes] | None = None,
    phase: Phase | None = None,
    keepalive: float = KEEPALIVE_SECONDS,
) -> None:
    """Relay `items` (`Started` or pieces, then the Reply) to `send`: the writer is made once the first item
    came, `opening` its first event (given the `Started`, when that came first), `end` the last one (from
    the Reply), `keepalive_event` (default: an SSE comment) whenever `keepalive` seconds pass without an
    item, `progress` one for each later `Started` (the prefill's `Progress` reports; without it they are skipped);
    `phase.ending` is set before the last."""
    first = await anext(items)  # errors until the stream starts get their own status
    writer = make()
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    started = first if isinstance(first, Started) else None
    head = opening(writer, started) if opening is not None else (COMMENT if started is not None else b"")
    if head:
        await send({"type": "http.response.body", "body": head, "more_body": True})
    ping = (lambda: keepalive_event(writer)) if keepalive_event is not None else (lambda: COMMENT)
    tx, rx = anyio.create_memory_object_stream[Item | _Failed](0)

    async def pump() -> None:
        async with tx:
            try:
                async for item in items:
                    await tx.send(item)
            except Exception as e:
                await tx.send(_Failed(e))

    failure: Exception | None = None
    item: Item | _Failed = first
    async with anyio.create_task_group() as tg, rx:  # nothing raises in here: failures are kept, then reported
        tg.start_soon(pump)
        while not isinstance(item, Reply):
            if isinstance(item, _Failed):
                failure = item.exc
                break
            if not isinstance(item, Started) or progress is not None:
                try:
                    if isinstance(item, Started):
                        chunk = progress(writer, item) if progress is not None else b""
                    else:
                        chunk = writer.piece(item)
                except Exception as e:
                    failure = e
                    break
                if chunk:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            item = await _next(rx, keepalive, send, ping)
        if failure is not None:
            tg.cancel_scope.cancel()
    if failure is None and isinstance(item, Reply):
        try:
            last = await end(writer, item)
        except Exception as e:
            failure = e
    if failure is not None:  # after the response started: an error event ends the stream
        last = writer.error(to_api_error(failure))
    if phase is not None:
        phase.ending = True
    await send({"type": "http.response.body", "body": last, "more_body": False})


async def _next(
    rx: anyio.abc.ObjectReceiveStream[Item | _Failed], keepalive: float, send: Send, ping: Callable[[], bytes]
) -> Item | _Failed:
    """The next item, sending a keep-alive each time `keepalive` seconds pass without one."""
    while True:
        with anyio.move_on_after(keepalive):
            try:
                return await rx.receive()
            except anyio.EndOfStream:
                return _Failed(RuntimeError("the turn's stream ended without its reply"))
        await send({"type": "http.response.body", "body": ping(), "more_body": True})
