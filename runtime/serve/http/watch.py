"""Running one request's work while watching for its client to leave (shared by the chat completions,
Messages and Responses endpoints).

Invariant: a disconnect cancels the work only while the response is not ending (`Phase.ending`): the
disconnect that follows the last bytes of a response is not a client leaving early.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio

from runtime.serve.asgi import Receive

__all__ = ["Phase", "run_watched"]


class Phase:
    """Where a request is: `ending` once its last bytes are being sent, `gone` if its client left before."""

    ending = False
    gone = False


async def run_watched(
    receive: Receive, work: Callable[[Phase], Awaitable[None]], fail: Callable[[Exception], Awaitable[None]]
) -> Phase:
    """Run `work(phase)`, cancelled if the client disconnects first; an exception it raises goes to `fail`
    (the response is ending by then). Returns the phase, whose `gone` says whether the client left."""
    phase = Phase()
    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            if not phase.ending:  # not the disconnect that follows the end of our response
                phase.gone = True
                tg.cancel_scope.cancel()

        tg.start_soon(watch)
        try:
            await work(phase)
        except Exception as e:
            phase.ending = True
            await fail(e)
        phase.ending = True
        tg.cancel_scope.cancel()
    return phase
