"""A snapshot of the engine for watchers (`Runtime.engine_view()`): the queue in arrival order, the request
on the slot and its phase, the cache tiers against their limits, and where each session's state is now.

Everything is read from memory on the event loop (the scheduler's queues, the slot's `Activity`, the
backend's counters): no I/O, no wait for the worker. Session ids are the Runtime's (internal) ids; an HTTP
adapter filters them per API key before anyone sees them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from caches.disk.stats import DiskTierStats
from runtime.backend.protocol import SlotStats
from runtime.loop.activity import Activity, Phase
from runtime.loop.scheduler import Job, Scheduler

__all__ = ["EngineView", "Running", "Tier", "Waiting", "build_view"]

MAX_LOCATIONS = 256  # sessions whose location a view lists (the most recently run ones)


class Waiting(msgspec.Struct, frozen=True, kw_only=True):
    request_id: int
    session_id: str
    kind: str
    waited: float  # seconds in the queue so far


class Running(msgspec.Struct, frozen=True, kw_only=True):
    request_id: int
    session_id: str
    kind: str
    phase: Phase | str  # "starting", "prefill", "decoding" (a turn) or "op" (a session operation)
    elapsed: float
    cached: int = 0
    done: int = 0
    total: int = 0
    generated: int = 0


class Tier(msgspec.Struct, frozen=True, kw_only=True):
    """A cache tier: states held, what they would take whole (`bytes`), what the tier holds (`stored`: shared
    blocks once) and its byte limit (None: no limit)."""

    entries: int
    bytes: int
    stored: int
    limit: int | None
    blocks: int | None = None  # shared blocks held (disk tier)


class EngineView(msgspec.Struct, frozen=True, kw_only=True):
    queue: list[Waiting]
    running: Running | None
    ram: Tier | None  # None: no RAM prompt cache
    disk: Tier | None  # None: no disk tier
    shared_blocks: int | None  # cells a shared block (None: whole states)
    slot_tokens: int
    locations: dict[str, str]  # session id -> "slot" | "ram" | "disk" | "none"
    busy: bool


def _waiting(job: Job[Any], now: float) -> Waiting:
    return Waiting(request_id=job.id, session_id=job.session_id, kind=str(job.kind), waited=now - job.submitted)


def _running(job: Job[Any] | None, activity: Activity, now: float) -> Running | None:
    if job is None:
        return None
    running = Running(
        request_id=job.id,
        session_id=job.session_id,
        kind=str(job.kind),
        phase="op" if str(job.kind) == "op" else "starting",
        elapsed=now - (job.started or job.submitted),
    )
    progress = activity.now
    if progress is None or progress.request_id != job.id:
        return running
    return msgspec.structs.replace(
        running,
        phase=progress.phase,
        cached=progress.cached,
        done=progress.done,
        total=progress.total,
        generated=progress.generated,
    )


def build_view(
    scheduler: Scheduler,
    activity: Activity,
    slot: SlotStats,
    disk: DiskTierStats | None,
    *,
    ram_limit: int | None,
    shared_blocks: int | None,
    last_keys: Mapping[str, int],
    last_session: str | None,
    locate: Callable[[int], str],
) -> EngineView:
    """The snapshot. `ram_limit`: the config's (None: no RAM cache, 0: no limit)."""
    now = time.perf_counter()
    ram = None
    if ram_limit is not None:
        ram = Tier(entries=slot.ram_entries, bytes=slot.ram_bytes, stored=slot.ram_held_bytes, limit=ram_limit or None)
    tier = None
    if disk is not None:
        tier = Tier(
            entries=disk.entries,
            bytes=disk.logical_bytes or disk.bytes,
            stored=disk.stored_bytes or disk.bytes,
            limit=disk.limit_bytes or None,
            blocks=disk.blocks,
        )
    recent = list(last_keys.items())[-MAX_LOCATIONS:]
    locations = {sid: "slot" if sid == last_session else locate(key) for sid, key in recent}
    return EngineView(
        queue=[_waiting(j, now) for j in scheduler.waiting()],
        running=_running(scheduler.running, activity, now),
        ram=ram,
        disk=tier,
        shared_blocks=shared_blocks,
        slot_tokens=slot.slot_tokens,
        locations=locations,
        busy=scheduler.busy,
    )
