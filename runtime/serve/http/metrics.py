"""GET /metrics: the Runtime's counters and the HTTP counters in the Prometheus text format (0.0.4)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from runtime.serve.http.state import ServeState

__all__ = ["CONTENT_TYPE", "render"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_OUTCOMES = ("completed", "failed", "cancelled", "timed_out", "rejected")
_TOKENS = ("prompt", "cached", "prefilled", "generated")
_LOADS = {"ram": "ram_loads", "disk": "disk_loads", "checkpoint": "checkpoint_restores"}


def _label(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class _Text:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def metric(self, name: str, kind: str, help_: str, samples: Iterable[tuple[dict[str, Any], float | int]]) -> None:
        rows = list(samples)
        if not rows:
            return
        self.lines += [f"# HELP turnstile_{name} {help_}", f"# TYPE turnstile_{name} {kind}"]
        for labels, value in rows:
            tag = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
            self.lines.append(f"turnstile_{name}{'{' + tag + '}' if tag else ''} {value}")


def render(state: ServeState) -> str:
    """The exposition text; only the HTTP counters and `ready` while the model loads."""
    out = _Text()
    rt = state.runtime
    out.metric(
        "ready",
        "gauge",
        "1 when the model is loaded and the server is not closing",
        [({}, int(rt is not None and not state.closing))],
    )
    out.metric(
        "http_responses_total",
        "counter",
        "HTTP responses by path and status",
        (({"path": p, "status": s}, n) for (p, s), n in sorted(state.responses.items())),
    )
    out.metric(
        "client_disconnects_total", "counter", "chat requests whose client left first", [({}, state.disconnects)]
    )
    if rt is None:
        return "\n".join(out.lines) + "\n"
    st = rt.stats()
    sch = st.scheduler
    out.metric("queue_depth", "gauge", "requests waiting in the queue", [({}, sch.queued)])
    out.metric("requests_running", "gauge", "requests running on the slot", [({}, sch.running)])
    out.metric(
        "requests_total",
        "counter",
        "requests by outcome",
        [({"outcome": o}, getattr(sch, o)) for o in _OUTCOMES],
    )
    slot = st.slot
    out.metric(
        "tokens_total",
        "counter",
        "prompt tokens, of them cached and prefilled, and generated tokens",
        [({"kind": k}, getattr(slot, f"{k}_tokens")) for k in _TOKENS if hasattr(slot, f"{k}_tokens")],
    )
    out.metric(
        "cache_loads_total",
        "counter",
        "states loaded into the slot by where they came from",
        [({"source": s}, getattr(slot, a)) for s, a in _LOADS.items() if hasattr(slot, a)],
    )
    tiers: list[tuple[dict[str, Any], int]] = []
    if hasattr(slot, "ram_bytes"):
        tiers.append(({"tier": "ram"}, slot.ram_bytes))
    if st.disk is not None:
        tiers.append(({"tier": "disk"}, st.disk.bytes))
    out.metric("state_bytes", "gauge", "bytes of cached states by tier", tiers)
    entries: list[tuple[dict[str, Any], int]] = []
    if hasattr(slot, "ram_entries"):
        entries.append(({"tier": "ram"}, slot.ram_entries))
    if st.disk is not None:
        entries.append(({"tier": "disk"}, st.disk.entries))
    out.metric("state_entries", "gauge", "cached states by tier", entries)
    if hasattr(slot, "draft_n"):
        drafts = [({"kind": "drafted"}, slot.draft_n), ({"kind": "accepted"}, slot.draft_n_accepted)]
        out.metric("draft_tokens_total", "counter", "tokens drafted by n-gram speculation, and accepted", drafts)
    out.metric("sessions", "gauge", "sessions in the store", [({}, st.sessions)])
    return "\n".join(out.lines) + "\n"
