"""llama-server's metric names (`llamacpp:*`) beside turnstile's on GET /metrics, for the counters turnstile
keeps with the same meaning. Not given (turnstile does not count them): the seconds totals and rates,
n_decode_total, n_tokens_max, n_busy_slots_per_decode, spec_decode_num_drafts_total."""

from __future__ import annotations

from runtime.api import RuntimeStats

__all__ = ["render"]

_METRICS: tuple[tuple[str, str, str], ...] = (
    ("prompt_tokens_total", "counter", "Number of prompt tokens processed, excluding cached tokens"),
    ("prompt_tokens_cached_total", "counter", "Number of prompt tokens reused from the cache"),
    ("tokens_predicted_total", "counter", "Number of generation tokens processed"),
    ("spec_decode_num_draft_tokens_total", "counter", "Speculative: Total draft tokens generated"),
    ("spec_decode_num_accepted_tokens_total", "counter", "Speculative: Total draft tokens accepted"),
    ("requests_processing", "gauge", "Number of requests processing"),
    ("requests_deferred", "gauge", "Number of requests deferred"),
)


def render(st: RuntimeStats) -> list[str]:
    slot, sch = st.slot, st.scheduler
    values = {
        "prompt_tokens_total": slot.prefilled_tokens,
        "prompt_tokens_cached_total": slot.cached_tokens,
        "tokens_predicted_total": slot.generated_tokens,
        "spec_decode_num_draft_tokens_total": slot.draft_n,
        "spec_decode_num_accepted_tokens_total": slot.draft_n_accepted,
        "requests_processing": sch.running,
        "requests_deferred": sch.queued,
    }
    lines: list[str] = []
    for name, kind, help_ in _METRICS:
        lines += [
            f"# HELP llamacpp:{name} {help_}",
            f"# TYPE llamacpp:{name} {kind}",
            f"llamacpp:{name} {values[name]}",
        ]
    return lines
