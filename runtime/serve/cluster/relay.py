"""ASGI over a call boundary: the two halves of one HTTP request that crosses from the ingress to a replica.

`Forwarder` is the ingress's ASGI app: it reads the request body (bounded), computes the routing key,
calls a replica through `call(key, scope, body)` (an async iterator of ASGI message batches) and sends the
messages on to the client. A call that fails with a `retryable` error before any message reached the
client (the replica died) is made again; the router then picks another replica. A client that leaves
cancels the call.

`drive` is the replica's half: it runs the real app (`runtime.serve.http.app`) on the forwarded scope and
body and yields the app's messages in batches, adding the replica id header to the response start. If
the caller goes away (the generator is closed), the app sees `http.disconnect` and withdraws its request.
No Ray here: the Ray Serve deployments (`runtime.serve.cluster.ray`) plug these into handles.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio

from runtime.log import get_logger
from runtime.serve.asgi import ASGIApp, Message, Receive, Scope, Send
from runtime.serve.cluster.affinity import routing_key
from runtime.serve.http.endpoint import ClientGone, read_body, send_error
from runtime.serve.http.errors import ApiError
from runtime.serve.http.identity import conversation_of

__all__ = ["REPLICA_HEADER", "Forwarder", "drive", "forwarded_scope"]

log = get_logger(__name__)

REPLICA_HEADER = b"x-turnstile-replica"
DRAIN_SECONDS = 30.0  # how long a replica's app may take to wind down after its caller left
Batch = list[Message]
Call = Callable[[str, dict[str, Any], bytes], AsyncIterator[Batch]]
_SCOPE_KEYS = ("type", "asgi", "http_version", "method", "scheme", "path", "raw_path", "query_string", "headers")


def forwarded_scope(scope: Scope) -> dict[str, Any]:
    """The parts of an HTTP scope a replica needs (plain, picklable values; no root_path: routes match path)."""
    out = {k: scope[k] for k in _SCOPE_KEYS if k in scope}
    out["headers"] = [(bytes(k), bytes(v)) for k, v in scope.get("headers", ())]
    out["root_path"] = ""
    for k in ("client", "server"):
        if scope.get(k) is not None:
            out[k] = tuple(scope[k])
    return out


class Forwarder:
    """The ingress ASGI app: each HTTP request goes to the replica its routing key picks."""

    def __init__(self, call: Call, *, max_body_bytes: int, retryable: tuple[type[BaseException], ...], tries: int = 4):
        self.call = call
        self.max_body_bytes = max_body_bytes
        self.retryable = retryable
        self.tries = tries

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":  # websockets: not served
            return
        try:
            body = await read_body(scope, receive, self.max_body_bytes)
        except ClientGone:
            return
        except ApiError as e:
            await send_error(send, e)
            return
        if scope.get("method") == "POST":
            headers = {k.lower(): v for k, v in scope.get("headers", [])}
            key = routing_key(conversation_of(headers, body), body)  # placement only: no ids are shared
        else:
            key = f"path:{scope.get('path', '')}"  # /health, /metrics, /v1/models: any replica
        fwd = forwarded_scope(scope)
        async with anyio.create_task_group() as tg:

            async def watch() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                log.info("ingress.client_gone", key=key)
                tg.cancel_scope.cancel()

            tg.start_soon(watch)
            await self._relay(key, fwd, body, send)
            tg.cancel_scope.cancel()

    async def _relay(self, key: str, scope: dict[str, Any], body: bytes, send: Send) -> None:
        for attempt in range(1, self.tries + 1):
            sent = False
            try:
                async for batch in self.call(key, scope, body):
                    for message in batch:
                        await send(message)
                        sent = True
                return
            except self.retryable as e:
                log.warning("ingress.replica_failed", key=key, attempt=attempt, sent=sent, error=type(e).__name__)
                if sent:  # the client has part of a response: end it (a retry would repeat it)
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    return
        await send_error(send, ApiError.unavailable(f"no replica answered after {self.tries} tries"))


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def drive(app: ASGIApp, scope: Scope, body: bytes, replica: str) -> AsyncIterator[Batch]:
    """Run `app` on one request; yield its ASGI messages in batches (whatever is ready at each step).

    If the caller leaves first (closes the generator, or is cancelled), the app is told `http.disconnect`
    and given `DRAIN_SECONDS` to wind down, then cancelled. The caller's own cancellation is never
    swallowed: cancelled during that wait, it cancels the app at once and propagates.
    """
    out: asyncio.Queue[Message | None] = asyncio.Queue()
    gone = asyncio.Event()
    given = False
    tag = (REPLICA_HEADER, replica.encode())

    async def receive() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), tag]}
        out.put_nowait(message)

    async def run() -> None:
        try:
            await app(dict(scope), receive, send)
        finally:
            out.put_nowait(None)

    task = asyncio.ensure_future(run())
    try:
        done = False
        while not done:
            batch: Batch = []
            item = await out.get()
            while True:
                if item is None:
                    done = True
                    break
                batch.append(item)
                if out.empty():
                    break
                item = out.get_nowait()
            if batch:
                yield batch
        await task  # the app's own errors surface here
    finally:
        if not task.done():  # the caller left: the app sees a disconnect and withdraws its request
            gone.set()
            try:
                await asyncio.wait({task}, timeout=DRAIN_SECONDS)  # never raises the app's errors; a cancel, yes
            finally:
                if not task.done():  # it outlived DRAIN_SECONDS, or the caller was cancelled meanwhile
                    task.cancel()
                    log.warning("replica.app_cancelled", replica=replica)
                elif not task.cancelled() and (error := task.exception()) is not None:
                    log.warning("replica.app_failed_after_disconnect", replica=replica, error=repr(error))
