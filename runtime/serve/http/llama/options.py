"""What `turnstile serve`'s llama-server flags set for the HTTP app."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["SYSTEM_FINGERPRINT", "LlamaOptions"]

# llama-server's system_fingerprint is "b" + its build number (clients check the "b"); turnstile names itself
SYSTEM_FINGERPRINT = "b0-turnstile"


@dataclass(frozen=True)
class LlamaOptions:
    """`sampling`: the values a request gets when it does not give its own (--temp, --seed, --n-predict);
    `slots`: GET /slots served (--slots, default) or 501 (--no-slots); `slot_save_path`: where
    /slots/0?action=save writes (--slot-save-path; None: save and restore answer 501 as llama-server's);
    `cors_origins`: the origins a browser may call from ("*": any; empty: no CORS headers at all);
    `aliases`, `tags`: what /v1/models lists (--alias, --tags)."""

    sampling: dict[str, Any] = field(default_factory=dict)
    slots: bool = True
    slot_save_path: Path | None = None
    cors_origins: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()  # --alias a,b,c: the model's names (its id is the first in sorted order)
    tags: tuple[str, ...] = ()  # --tags
    embeddings: bool = False  # /embedding(s) and /v1/embeddings served (--embedding) or 501, as llama-server's
    reranking: bool = False  # /rerank and its aliases served (--reranking: rank pooling) or 501
    metrics: bool = True  # GET /metrics served (--metrics, default) or 501 (--no-metrics, llama-server's default)
