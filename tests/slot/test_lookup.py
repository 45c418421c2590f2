"""turnstile's lookup rule (`runtime.slot.lookup`): the longest state any tier holds, when it pays for its load.

The pure rule without a model; then agents sharing a long system prompt, interleaved on the tiny llama
model, under both cache rules (turnstile: from each agent's second turn on only its new tokens are
prefilled; llama-server: its decision exactly, the slot kept through the shared prompt); then a suite of
conversations run twice through a plain Runtime over a disk tier (issue 26's case).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from caches.prompt_cache import lcp, update_due
from caches.tiered import Candidate
from runtime.backend.protocol import SlotRequest
from runtime.config import EngineConfig
from runtime.llama.engine import Engine
from runtime.slot.executor import Slot
from runtime.slot.lookup import MEASURED, LoadCost, choose, usable
from runtime.slot.state import Checkpoint
from runtime.types import CacheRules
from sessions import Sampling

CFG = EngineConfig(n_ctx=4096, n_threads=1, n_ubatch=64, n_batch=256)
GREEDY = Sampling(temperature=0.0).with_overrides(max_tokens=8)
SYSTEM = "You are one of the lighthouse crew's agents. Tools: lamp(on), log(entry), tide(hour). " * 12


def _c(tier: str, kept: int, nbytes: int, index: int = -1) -> Candidate:
    return Candidate(tier, kept, tuple(range(kept + 5)), nbytes, index)  # type: ignore[arg-type]


def test_choose_takes_the_longest_candidate_worth_its_load() -> None:
    cost = LoadCost(prefill_s_per_token=1e-3, ram_bytes_per_s=1e6, disk_bytes_per_s=1e6, disk_fixed_s=0.0)
    # 1 ms a token, 1 MB/s: a load of 10 kB costs 10 ms = 10 tokens
    near, far = _c("ram", 50, 10_000, 0), _c("ram", 80, 10_000, 1)
    assert choose(40, 200, [near, far], cost) is far
    assert choose(70, 200, [near, far], cost) is None  # 10 tokens gained do not pay for 10 ms (strictly more)
    assert choose(69, 200, [near, far], cost) is far  # 11 do
    big = _c("ram", 90, 1_000_000, 2)  # 1 s of loading for 50 more tokens: not worth it
    assert choose(40, 200, [near, far, big], cost) is far
    on_disk = _c("disk", 80, 5_000)
    assert choose(40, 200, [far, on_disk], cost) is far  # equal kept: RAM first
    assert choose(40, 200, [on_disk, _c("disk", 80, 4_000)], cost) == _c("disk", 80, 4_000)  # then fewer bytes
    # the last prompt token is always evaluated: keeping all 81 of an 81-token prompt counts as 80
    assert choose(80, 81, [_c("ram", 81, 1, 0)], cost) is None
    assert choose(79, 81, [_c("ram", 81, 1, 0)], cost) is not None
    assert choose(0, 81, [], cost) is None


def test_measured_costs_decide_like_the_calibration() -> None:
    # SmolLM2: 23,040 bytes of KV a token; a 1,700-token state is 39 MB: 17.5 ms from disk = 3.4 prefill tokens
    nbytes = 1700 * 23_040
    assert MEASURED.worth_loading(4, "disk", nbytes) and not MEASURED.worth_loading(3, "disk", nbytes)
    assert MEASURED.worth_loading(2, "ram", nbytes) and not MEASURED.worth_loading(1, "ram", nbytes)
    assert MEASURED.worth_saving(5, nbytes) and not MEASURED.worth_saving(4, nbytes)  # a 25 ms copy
    assert not MEASURED.worth_loading(0, "ram", 0) and not MEASURED.worth_saving(0, 0)


def test_usable_is_the_checkpoint_a_memory_that_cannot_truncate_rolls_back_to() -> None:
    cps = [Checkpoint(n_tokens=n, pos_min=0, pos_max=n, data=b"x") for n in (10, 40, 90)]
    assert usable(60, 100, cps, can_truncate=True) == 60
    assert usable(60, 100, cps, can_truncate=False) == 40
    assert usable(100, 100, cps, can_truncate=False) == 100  # continued whole
    assert usable(5, 100, cps, can_truncate=False) == 0


def _agents(eng: Engine, slot: Slot, n_agents: int, n_turns: int) -> list[dict[str, Any]]:
    histories: list[list[dict[str, str]]] = [[] for _ in range(n_agents)]
    held: dict[int, list[int]] = {}
    prev: dict[int, int] = {}
    out: list[dict[str, Any]] = []
    for t in range(n_turns):
        for a in range(n_agents):
            user = f"I am agent {a}. Turn {t}: what does the tide do at hour {a + t}?"
            msgs = [{"role": "system", "content": SYSTEM}, *histories[a], {"role": "user", "content": user}]
            prompt = eng.render(msgs).tokens
            before = list(slot.tokens)
            res = slot.run(SlotRequest(prompt=prompt, sampling=GREEDY))
            out.append(
                {
                    "turn": t,
                    "prompt": prompt,
                    "before": before,
                    "own": held.get(a),
                    "prev_prompt": prev.get(a),
                    "res": res,
                }
            )
            held[a], prev[a] = [*prompt, *res.tokens[:-1]], len(prompt)
            assert slot.tokens == held[a]
            histories[a] += [{"role": "user", "content": user}, {"role": "assistant", "content": res.text}]
    return out


@pytest.mark.parametrize("rules", ["turnstile", "llama-server"])
@pytest.mark.parametrize("shared", [None, 16])
def test_agents_sharing_a_long_system_prompt_prefill_only_their_new_message(
    rules: CacheRules, shared: int | None, tiny_models: dict[str, Path], make_engine: Callable[..., Engine]
) -> None:
    eng = make_engine(tiny_models["llama"], CFG)
    slot = Slot(eng, cache_ram_bytes=0, cache_rules=rules, shared_blocks=shared)  # RAM without a limit
    turns = _agents(eng, slot, 4, 4)
    n_system = lcp(turns[0]["prompt"], turns[1]["prompt"])
    assert n_system > 600  # the shared prefix is long
    for x in turns:
        res, prompt = x["res"], x["prompt"]
        assert res.cached_tokens + res.prefilled_tokens == len(prompt)
        if x["turn"] == 0:
            continue
        own = x["own"]
        if rules == "turnstile":
            # its own state comes back: only what its previous state does not hold is prefilled (the new
            # message, and the reply where its rendering differs from the generated tokens)
            assert res.cache_source == "ram"
            assert res.cached_tokens == lcp(own, prompt)
            assert res.prefilled_tokens == len(prompt) - lcp(own, prompt)
            assert lcp(own, prompt) >= x["prev_prompt"]  # all of its previous prompt is kept
        else:
            # llama-server: the slot (another agent's) matches over half of itself through the shared prompt,
            # so nothing is looked up and everything after the shared prefix is prefilled again
            assert not update_due(x["before"], prompt)
            assert res.cache_source == "slot"
            assert res.cached_tokens == lcp(x["before"], prompt) < lcp(own, prompt)
            assert res.prefilled_tokens == len(prompt) - lcp(x["before"], prompt)
    later = [x for x in turns if x["turn"] > 0]
    total = sum(x["res"].prefilled_tokens for x in later)
    ideal = sum(len(x["prompt"]) - lcp(x["own"], x["prompt"]) for x in later)
    assert (total == ideal) if rules == "turnstile" else (total > 2 * ideal)


async def test_a_suite_run_twice_over_the_disk_tier_prefills_almost_nothing(tiny_llama: Path, tmp_path: Path) -> None:
    from runtime import Runtime

    opts: dict[str, Any] = {"n_ctx": 4096, "n_threads": 1, "cache_ram_mib": 64}
    system = "You test the lighthouse app. Answer in one short line. " * 20

    async def suite() -> tuple[list[str], int, int]:
        texts: list[str] = []
        prompt = prefilled = 0
        async with Runtime.open(tiny_llama, data_dir=tmp_path, **opts) as rt:
            for test in range(8):  # each test: its own conversation, removed at its end
                sid = f"test-{test}"
                await rt.create_session(sid, system=system)
                for t in range(3):
                    r = await rt.chat(sid, f"case {test}, step {t}: check the lamp", max_tokens=6, temperature=0.0)
                    texts.append(r.text)
                    prompt += r.usage.prompt_tokens
                    prefilled += r.usage.prefilled_tokens
                await rt.delete(sid)
        return texts, prompt, prefilled

    first, p1, f1 = await suite()
    second, p2, f2 = await suite()
    assert second == first and p2 == p1
    print(f"second run prefilled {f2} of {p2} prompt tokens ({f2 / f1:.1%} of the first run's {f1})")
    assert f2 <= 0.05 * f1
