"""Sending a turn's pieces as server-sent events (shared by chat completions, Messages and Responses).

The rule every streaming endpoint keeps: an error before the first piece gets its own status (the caller's
error response: nothing has been sent yet); once the 200 has gone out, an error is the dialect's error event
that ends the stream. Each dialect brings a writer (its events for a piece and for an error) and its end.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol, TypeVar

from runtime.reply import Reply, ToolCallDelta
from runtime.serve.asgi import Send
from runtime.serve.http.errors import ApiError, to_api_error
from runtime.serve.http.watch import Phase

__all__ = ["SSE_HEADERS", "PieceWriter", "relay"]

SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


class PieceWriter(Protocol):
    def piece(self, piece: str | ToolCallDelta, /) -> bytes: ...

    def error(self, err: ApiError, /) -> bytes: ...


W = TypeVar("W", bound=PieceWriter)


async def relay(
    items: AsyncIterator[str | ToolCallDelta | Reply],
    send: Send,
    make: Callable[[], W],
    end: Callable[[W, Reply], Awaitable[bytes]],
    *,
    opening: Callable[[W], bytes] | None = None,
    phase: Phase | None = None,
) -> None:
    """Relay `items` (pieces, then the Reply) to `send`: the writer is made once the first piece came,
    `opening` its first event, `end` the last one (from the Reply); `phase.ending` is set before the last."""
    first = await anext(items)  # errors until the first piece get their own status
    writer = make()
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    if opening is not None:
        await send({"type": "http.response.body", "body": opening(writer), "more_body": True})
    try:
        item = first
        while not isinstance(item, Reply):
            chunk = writer.piece(item)
            if chunk:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            item = await anext(items)
        last = await end(writer, item)
    except Exception as e:  # after the response started: an error event ends the stream
        last = writer.error(to_api_error(e))
    if phase is not None:
        phase.ending = True
    await send({"type": "http.response.body", "body": last, "more_body": False})
