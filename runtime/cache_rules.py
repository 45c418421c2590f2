"""The cache rules a slot follows, as named behaviours: `CacheRuleSet.named("turnstile" | "llama-server")`,
built once (by `CacheConfig`, or by a `Slot` given a name) and read by what acts on them.

The one place that knows what each name means: nothing else compares a `cache_rules` string
(`tests/project/test_structure.py` checks it).

- "llama-server": its prompt cache and checkpoints exactly (the parity runs), speculation off;
- "turnstile": the same, except each behaviour below that is on.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.errors import InvalidConfig
from runtime.types import CACHE_RULES, CacheRules

__all__ = ["LLAMA_SERVER", "MIN_SHARED_PREFIX", "TURNSTILE", "CacheRuleSet"]

MIN_SHARED_PREFIX = 32
"""turnstile's `min_shared_prefix`: longer than the chat-template tokens unrelated conversations share (SmolLM2's
default system prompt and header: 24), shorter than a system prompt worth sharing. Reusing fewer saves a few ms of
one prefill batch and makes a reply depend on which conversation the slot held before it (docs/cache.md)."""


@dataclass(frozen=True)
class CacheRuleSet:
    """What a set of cache rules does, one flag per behaviour (each False under llama-server's rules)."""

    name: CacheRules
    longest_state: bool  # every turn takes the longest usable state any tier holds when it pays (slot/lookup.py)
    retain_partial: bool  # an entry a load uses in part stays cached for the conversation it belongs to
    checkpoint_prompt_end: bool  # models that need checkpoints also get one at the end of each prompt
    defer_last_token: bool  # a reply's last sampled token is evaluated after the reply went out (slot/commit.py)
    count_shared_bytes: bool  # with shared blocks, the RAM cache's limits count what its entries hold together
    speculation: bool  # n-gram speculative decoding may run (llama-server's rules keep it off)
    replay: bool  # a resent reply is given to the model as the tokens generated for it (runtime/loop/replay.py)
    # a prefix shared with a state the prompt does not continue whole (another conversation's) is reused only when
    # it is at least this long (slot/executor.py, slot/lookup.py); 0: any length, as llama-server
    min_shared_prefix: int = 0

    @staticmethod
    def named(rules: CacheRules | CacheRuleSet) -> CacheRuleSet:
        """The rule set of that name, built once (a rule set is returned as it is); `InvalidConfig` for another name."""
        if isinstance(rules, CacheRuleSet):
            return rules
        if rules not in CACHE_RULES:
            raise InvalidConfig(f"cache_rules must be 'turnstile' or 'llama-server', not {rules!r}")
        return _BY_NAME[rules]


def _built(name: CacheRules) -> CacheRuleSet:
    on = name == "turnstile"  # every behaviour is turnstile's own: llama-server's rules have none of them
    return CacheRuleSet(name, on, on, on, on, on, on, on, MIN_SHARED_PREFIX if on else 0)


TURNSTILE = _built("turnstile")
LLAMA_SERVER = _built("llama-server")
_BY_NAME = {rules.name: rules for rules in (TURNSTILE, LLAMA_SERVER)}
