"""Relaying a stream of server-sent events that the server makes up as it goes (the engine view, an agents
room), while watching for the client to leave: a disconnect cancels the stream's producer (and with it any
turn it awaits, which the Runtime withdraws: nothing is committed)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from typing import Any

import msgspec

from runtime.log import get_logger
from runtime.serve.asgi import Receive, Send
from runtime.serve.http.errors import to_api_error
from runtime.serve.http.event_stream import SSE_HEADERS
from runtime.serve.http.watch import Phase, run_watched

__all__ = ["event", "stream_events"]

log = get_logger(__name__)


def event(name: str, data: Any) -> bytes:
    """One server-sent event with a JSON payload."""
    return b"event: " + name.encode() + b"\ndata: " + msgspec.json.encode(data) + b"\n\n"


async def stream_events(receive: Receive, send: Send, events: AsyncGenerator[bytes, None]) -> Phase:
    """Send a 200 and then `events` until they end (or the client leaves: the producer is cancelled); an
    error while producing ends the stream with an `error` event in OpenAI's error shape."""
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})

    async def work(phase: Phase) -> None:
        async with contextlib.aclosing(events):
            async for chunk in events:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        phase.ending = True
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def fail(e: Exception) -> None:
        err = to_api_error(e)
        await send(
            {"type": "http.response.body", "body": event("error", msgspec.json.decode(err.body())), "more_body": False}
        )

    return await run_watched(receive, work, fail)
