"""GET /metrics: the Runtime's counters and the HTTP counters in the Prometheus text format (0.0.4).

Rendering runs on the event loop and reads only counters kept in memory (`Runtime.stats()`: the
scheduler's, the slot's, the disk tier's and the store's session count), so a scrape never waits for a
disk write, a store's I/O or the slot's worker.
"""

from __future__ import annotations

from collections.abc import Iterable

from runtime.serve.http.llama import metrics as llama_metrics
from runtime.serve.http.responses.store import ResponseStore
from runtime.serve.http.state import ServeState

__all__ = ["CONTENT_TYPE", "render"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Labels = dict[str, str | int]
Samples = Iterable[tuple[Labels, int | float]]


def _label(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class _Text:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def metric(self, name: str, kind: str, help_: str, samples: Samples) -> None:
        rows = list(samples)
        if not rows:
            return
        self.lines += [f"# HELP turnstile_{name} {help_}", f"# TYPE turnstile_{name} {kind}"]
        for labels, value in rows:
            tag = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
            self.lines.append(f"turnstile_{name}{'{' + tag + '}' if tag else ''} {value}")


def render(state: ServeState, store: ResponseStore | None = None) -> str:
    """The exposition text; only the HTTP counters, `ready` and the Responses store while the model loads."""
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
        "http_responses_by_key_total",
        "counter",
        "HTTP responses to authenticated requests by API key name (never the key) and status",
        (({"key": k, "status": s}, n) for (k, s), n in sorted(state.responses_by_key.items())),
    )
    rows = state.ledger.rows()
    out.metric(
        "key_usage",
        "gauge",
        "each API key's (by name) usage of each quota: sessions and bytes as last counted, requests in flight, "
        "requests and tokens of the last minute",
        (({"key": k, "quota": q}, used) for k, q, used, _ in rows if used is not None),
    )
    out.metric(
        "key_limit",
        "gauge",
        "each API key's (by name) quotas that are set",
        (({"key": k, "quota": q}, limit) for k, q, _, limit in rows if limit is not None),
    )
    out.metric(
        "key_rejected_total",
        "counter",
        "requests refused (429) by API key name and the quota they were over",
        (({"key": k, "quota": q}, n) for k, q, n in state.ledger.rejected()),
    )
    out.metric(
        "client_disconnects_total", "counter", "chat requests whose client left first", [({}, state.disconnects)]
    )
    out.metric(
        "http_ignored_fields_total",
        "counter",
        "top-level request fields ignored (not declared by the dialect), by dialect and field name",
        (({"api": a, "field": f}, n) for (a, f), n in sorted(state.unknown_fields.counts.items())),
    )
    if store is not None:
        _store(out, store)
    if rt is None:
        return "\n".join(out.lines) + "\n"
    st = rt.stats()
    sch, slot, disk = st.scheduler, st.slot, st.disk
    out.metric("queue_depth", "gauge", "requests waiting in the queue", [({}, sch.queued)])
    out.metric("requests_running", "gauge", "requests running on the slot", [({}, sch.running)])
    outcomes = {
        "completed": sch.completed,
        "failed": sch.failed,
        "cancelled": sch.cancelled,
        "timed_out": sch.timed_out,
        "rejected": sch.rejected,
    }
    out.metric("requests_total", "counter", "requests by outcome", (({"outcome": o}, n) for o, n in outcomes.items()))
    out.metric(
        "prefill_pauses_total",
        "counter",
        "prefills paused at a chunk boundary for a waiting request (policy fair)",
        [({}, sch.pauses - sch.decode_pauses)],
    )
    out.metric(
        "prefill_aborts_total",
        "counter",
        "prefill pauses that aborted the running chunk, its work thrown away (policy fair)",
        [({}, sch.prefill_aborts)],
    )
    out.metric(
        "prefill_aborted_tokens_total",
        "counter",
        "prompt tokens evaluated in aborted prefill chunks and evaluated again later (policy fair)",
        [({}, sch.aborted_tokens)],
    )
    out.metric(
        "prefill_aborted_seconds_total",
        "counter",
        "seconds of prefill work thrown away in aborted chunks (policy fair)",
        [({}, round(sch.aborted_seconds, 6))],
    )
    out.metric(
        "decode_pauses_total",
        "counter",
        "generations paused after a token for a waiting request's first token (policy fair)",
        [({}, sch.decode_pauses)],
    )
    tokens = {
        "prompt": slot.prompt_tokens,
        "cached": slot.cached_tokens,
        "prefilled": slot.prefilled_tokens,
        "generated": slot.generated_tokens,
    }
    out.metric(
        "tokens_total",
        "counter",
        "prompt tokens, of them cached and prefilled, and generated tokens",
        (({"kind": k}, n) for k, n in tokens.items()),
    )
    loads = {"ram": slot.ram_loads, "disk": slot.disk_loads, "checkpoint": slot.checkpoint_restores}
    out.metric(
        "cache_loads_total",
        "counter",
        "states loaded into the slot by where they came from",
        (({"source": s}, n) for s, n in loads.items()),
    )
    tiers: list[tuple[Labels, int]] = [({"tier": "ram"}, slot.ram_bytes)]
    entries: list[tuple[Labels, int]] = [({"tier": "ram"}, slot.ram_entries)]
    if disk is not None:
        tiers.append(({"tier": "disk"}, disk.bytes))
        entries.append(({"tier": "disk"}, disk.entries))
    out.metric("state_bytes", "gauge", "bytes of cached states by tier", tiers)
    out.metric("state_entries", "gauge", "cached states by tier", entries)
    storage = st.storage
    out.metric(
        "state_logical_bytes",
        "gauge",
        "bytes whole copies of the cached states would take, by tier",
        (({"tier": t}, b.logical) for t, b in storage.items()),
    )
    out.metric(
        "state_stored_bytes",
        "gauge",
        "bytes the tier holds for its cached states (each shared block once), by tier",
        (({"tier": t}, b.stored) for t, b in storage.items()),
    )
    if disk is not None:
        out.metric("state_blocks", "gauge", "shared KV blocks held, by tier", [({"tier": "disk"}, disk.blocks)])
    drafts: list[tuple[Labels, int]] = [
        ({"kind": "drafted"}, slot.draft_n),
        ({"kind": "accepted"}, slot.draft_n_accepted),
    ]
    out.metric("draft_tokens_total", "counter", "tokens drafted by n-gram speculation, and accepted", drafts)
    out.metric("sessions", "gauge", "sessions in the store", [({}, st.sessions)])
    out.lines += llama_metrics.render(st)  # llama-server's names for the same counters
    return "\n".join(out.lines) + "\n"


def _store(out: _Text, store: ResponseStore) -> None:
    """The stored responses of the Responses API: totals, the limits, and each API key name's share."""
    st = store.gauges()
    out.metric("stored_responses", "gauge", "responses kept for previous_response_id", [({}, st.responses)])
    out.metric("stored_response_bytes", "gauge", "bytes of the stored responses", [({}, st.bytes)])
    limits: list[tuple[Labels, int]] = [({"kind": "responses"}, st.max_responses), ({"kind": "bytes"}, st.max_bytes)]
    out.metric("stored_response_limit", "gauge", "the store's limits (least recently used evicted past them)", limits)
    out.metric(
        "stored_response_evictions_total", "counter", "stored responses evicted past the limits", [({}, st.evicted)]
    )
    keys = sorted(st.by_key.items())
    out.metric(
        "stored_responses_by_key",
        "gauge",
        "stored responses by API key name (never the key)",
        (({"key": k}, s.responses) for k, s in keys),
    )
    out.metric(
        "stored_response_bytes_by_key",
        "gauge",
        "bytes of stored responses by API key name (never the key)",
        (({"key": k}, s.bytes) for k, s in keys),
    )
    out.metric(
        "stored_response_evictions_by_key_total",
        "counter",
        "stored responses evicted, by the API key name that made them (never the key)",
        (({"key": k}, s.evicted) for k, s in keys),
    )
