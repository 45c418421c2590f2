"""Named normalizations of volatile prompt spans: text a client puts into the prompt that changes between
requests of one conversation without meaning anything to the model, and would end the cached prefix there.
Each is documented in docs/coding-agents.md; `turnstile serve --no-normalize` turns them all off, so the
model sees exactly the rendering of what the client sent.

- `billing-header` (Messages): Claude Code starts its system prompt with
  `x-anthropic-billing-header: cc_version=…; cc_entrypoint=…; cch=XXXXX;` where `cch` is a per-request
  integrity stamp. Its value is replaced by as many `f`s, as llama-server does (tools/server/server-chat.cpp,
  `normalize_anthropic_billing_header`, ggml-org/llama.cpp#21793): same length, no other change.
"""

from __future__ import annotations

import re

__all__ = ["BILLING_PREFIX", "billing_header"]

BILLING_PREFIX = "x-anthropic-billing-header:"
_CCH = re.compile(r"cch=([0-9A-Za-z]+);")


def billing_header(text: str) -> str:
    """`text` with the `cch=` stamp of a leading billing header blanked (any other text unchanged)."""
    if not text.startswith(BILLING_PREFIX):
        return text
    m = _CCH.search(text, len(BILLING_PREFIX))
    if m is None:
        return text
    return text[: m.start(1)] + "f" * len(m.group(1)) + text[m.end(1) :]
