"""Shares of the RAM and disk tiers among API keys (`caches.shares`): a full tier evicts from the key furthest over
its share first, so one key filling RAM and disk leaves another key's recent states in place, and a key alone
uses the whole tier. The rule, the RAM prompt cache (both eviction orders), the disk tier on a real diskcache
directory (and its usage rows' versions), and a real model through the Runtime."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from caches.disk.tier import DiskTier
from caches.disk.usage import format_usage, parse_usage
from caches.prompt_cache import Entry, PromptCache
from caches.shares import Weights, owner_of, share_order
from runtime import Runtime

FP = "model-sha256:shares"
ONE: Callable[[str], int] = lambda _owner: 1  # noqa: E731


# --- the rule ---------------------------------------------------------------------------------------------


def test_owner_is_the_key_namespace() -> None:
    assert owner_of("alice@chat-1") == "alice"
    assert owner_of("alice@a@b") == "alice"
    assert owner_of("chat-1") == ""  # no namespace: no key
    assert owner_of("a b@c") == ""  # not a key name: charged to no key
    assert owner_of(f"{'k' * 65}@c") == ""


def test_one_owner_keeps_the_tier_order() -> None:
    assert share_order([2, 0, 1], ["a", "a", "a"], [10, 20, 30], 40, ONE) == [2, 0, 1]
    assert share_order([0, 1], ["a", "b"], [10, 20], 0, ONE) == [0, 1]  # no limit: no shares


def test_the_owner_furthest_over_its_share_goes_first() -> None:
    # b's state is the oldest; a holds 90 of a 100-byte tier (share 50 each): a's go first, b's last
    owners, charges = ["b", "a", "a", "a"], [10, 30, 30, 30]
    assert share_order([0, 1, 2, 3], owners, charges, 100, ONE) == [1, 2, 3, 0]
    # weights 3 : 1 (shares 75 and 25): a holds 60, b 40 (15 over): b down to 10 before a
    owners, charges = ["a", "a", "b", "b", "b", "b"], [30, 30, 10, 10, 10, 10]
    weight = {"a": 3, "b": 1}.__getitem__
    assert share_order(range(6), owners, charges, 100, weight) == [2, 3, 4, 0, 5, 1]  # a tie at 4: the older
    # the state being saved counts for its owner
    assert share_order([0, 1], ["a", "b"], [40, 40], 100, ONE, incoming=("b", 40)) == [1, 0]


# --- the RAM tier -------------------------------------------------------------------------------------------


def _fill(pc: PromptCache[str], owner: str, first: int, count: int) -> None:
    """`count` states of 10 bytes, unrelated token runs (none holds another)."""
    for i in range(first, first + count):
        assert pc.save([1000 * i + t for t in range(5)], 10, lambda i=i: f"s{i}", owner)


def _held(entries: Any) -> int:
    return sum(e.nbytes for e in entries)


@pytest.mark.parametrize("held", [None, _held], ids=["llama-server order", "predicted-use order"])
def test_ram_a_key_filling_it_leaves_another_keys_states(held: Callable[..., int] | None) -> None:
    pc: PromptCache[str] = PromptCache(100, 0, held=held)
    _fill(pc, "bob", 0, 2)
    _fill(pc, "alice", 2, 20)
    gone = pc.update()
    assert [e.owner for e in pc.entries].count("bob") == 2  # bob's two states are still there
    assert [e.state for e in pc.entries if e.owner == "bob"] == ["s0", "s1"]
    assert len(pc) == 10 and pc.nbytes == 100  # alice has the rest: 8 states
    assert len(gone) == 12 and {e.owner for e in gone} == {"alice"}
    if held is None:  # llama-server's order within alice's: the oldest first
        assert [e.state for e in gone] == [f"s{i}" for i in range(2, 14)]


@pytest.mark.parametrize("held", [None, _held], ids=["llama-server order", "predicted-use order"])
def test_ram_a_key_alone_uses_all_of_it(held: Callable[..., int] | None) -> None:
    pc: PromptCache[str] = PromptCache(100, 0, held=held)
    _fill(pc, "alice", 0, 10)
    assert len(pc) == 10 and pc.update() == []  # all 100 bytes
    _fill(pc, "alice", 10, 1)
    assert len(pc) == 10 and len(pc.update()) == 1


def test_ram_weights_set_the_shares() -> None:
    weights = Weights()
    weights.set({"alice": 3, "bob": 1}.__getitem__)
    pc: PromptCache[str] = PromptCache(100, 0, weights=weights)
    _fill(pc, "bob", 0, 6)  # bob alone: 60 bytes, fine
    _fill(pc, "alice", 6, 10)  # shares 75 and 25: bob's oldest go while he is further over his (a tie: the older)
    gone = pc.update()
    assert [e.state for e in gone] == ["s0", "s1", "s2", "s3", "s6", "s7"]
    assert [e.owner for e in pc.entries] == ["bob"] * 2 + ["alice"] * 8


def test_ram_entries_without_keys_stay_llama_servers() -> None:
    pc: PromptCache[str] = PromptCache(100, 0)
    _fill(pc, "", 0, 12)
    assert [e.state for e in pc.update()] == ["s0", "s1"]
    assert isinstance(pc.entries[0], Entry) and pc.entries[0].owner == ""


# --- the disk tier ------------------------------------------------------------------------------------------


def payload(seed: int) -> bytes:
    return (seed.to_bytes(4, "little") * 8192)[: 32 << 10]  # 32 KiB: a file of diskcache's


def run(i: int) -> list[int]:
    return [1000 * i + t for t in range(20)]


def _entry_bytes(tmp: Path) -> int:
    with DiskTier(tmp / "probe", fingerprint=FP) as t:
        assert t.put(run(0), payload(0))
        return t.nbytes


def test_disk_a_key_filling_it_leaves_another_keys_states(tmp_path: Path) -> None:
    size = _entry_bytes(tmp_path)
    with DiskTier(tmp_path / "d", fingerprint=FP, limit_bytes=10 * size) as t:
        for i in range(2):
            assert t.put(run(i), payload(i), owner="bob")
        for i in range(2, 22):
            assert t.put(run(i), payload(i), owner="alice")
        assert len(t) == 10 and t.stats().evictions == 12
        assert t.find(run(0)) == (run(0), payload(0)) and t.find(run(1)) == (run(1), payload(1))
        assert [i for i in range(2, 22) if t.find(run(i)) is not None] == list(range(14, 22))  # alice's newest 8
    # the owners are in the directory: a reopened tier still evicts alice's first
    with DiskTier(tmp_path / "d", fingerprint=FP, limit_bytes=10 * size) as t:
        assert len(t) == 10
        assert t.put(run(22), payload(22), owner="alice")
        assert t.find(run(0)) is not None and t.find(run(1)) is not None and t.find(run(14)) is None


def test_disk_a_key_alone_uses_all_of_it(tmp_path: Path) -> None:
    size = _entry_bytes(tmp_path)
    with DiskTier(tmp_path / "d", fingerprint=FP, limit_bytes=10 * size) as t:
        for i in range(12):
            assert t.put(run(i), payload(i), owner="alice")
        assert len(t) == 10 and t.nbytes == 10 * size
        assert [i for i in range(12) if t.find(run(i)) is not None] == list(range(2, 12))  # least recently used out


def test_disk_weights_set_the_shares(tmp_path: Path) -> None:
    size = _entry_bytes(tmp_path)
    weights = Weights()
    weights.set({"alice": 4, "bob": 1}.__getitem__)
    with DiskTier(tmp_path / "d", fingerprint=FP, limit_bytes=10 * size, weights=weights) as t:
        for i in range(5):
            assert t.put(run(i), payload(i), owner="bob")
        for i in range(5, 15):
            assert t.put(run(i), payload(i), owner="alice")
        held = [i for i in range(15) if t.find(run(i)) is not None]
        assert held == [3, 4, *range(7, 15)]  # bob down to his share of 2 of 10, alice 8


def test_usage_rows_versions() -> None:
    assert format_usage(5, 10, "alice") == "5:10:alice"
    assert parse_usage("5:10:alice", 0) == (5, 10, "alice")
    assert parse_usage("5:10:", 0) == (5, 10, "")
    assert parse_usage("5:10", 0) == (5, 10, "")  # version 1 (before owners): no key
    assert parse_usage("5:10:a b", 7) == (0, 7, "")  # not a key name: malformed
    assert parse_usage("5:10:a:b", 7) == (0, 7, "")
    assert parse_usage(b"5:10", 7) == (0, 7, "")
    with pytest.raises(ValueError):
        format_usage(5, 10, "a:b")


def test_disk_version_1_rows_are_read_as_no_key(tmp_path: Path) -> None:
    """A directory written before owners (usage rows `"<ns>:<bytes>"`): its states stay usable, charged to no key."""
    size = _entry_bytes(tmp_path)
    with DiskTier(tmp_path / "d", fingerprint=FP, limit_bytes=10 * size) as t:
        for i in range(4):
            assert t.put(run(i), payload(i))
    import diskcache  # the rows as version 1 wrote them

    with diskcache.Cache(str(tmp_path / "d")) as raw:
        keys = [k for k in raw.iterkeys() if isinstance(k, str) and k.startswith("turnstile:u:")]
        assert len(keys) == 4
        for k in keys:
            stamp, nbytes, owner = str(raw[k]).split(":")
            assert owner == ""
            raw[k] = f"{stamp}:{nbytes}"
    with DiskTier(tmp_path / "d", fingerprint=FP, limit_bytes=10 * size) as t:
        assert len(t) == 4 and t.stats().rejected == 0
        assert t.find(run(0)) == (run(0), payload(0))
        for i in range(4, 12):  # bob fills up: the keyless states (4, under their share of 5) stay
            assert t.put(run(i), payload(i), owner="bob")
        assert [i for i in range(12) if t.find(run(i)) is not None] == [0, 1, 2, 3, *range(6, 12)]


# --- a real model through the Runtime ---------------------------------------------------------------------


def _system(name: str) -> str:
    return f"You are the helper of {name}. Answer in one short line."


async def _turn(rt: Runtime, session: str, text: str) -> Any:
    return await rt.chat(session, text, temperature=0.0, max_tokens=4)


@pytest.mark.parametrize("ram_mib", [3, 0], ids=["RAM and disk", "disk alone"])
async def test_runtime_key_b_keeps_its_recent_states(smollm2_path: Path, tmp_path: Path, ram_mib: int) -> None:
    """SmolLM2 (under 1 MiB a state here): bob's two conversations, then alice's eight fill the RAM tier (3 MiB, or
    none) and the disk tier (3 MiB). bob's share of each is half: alice's states go first. bob's next turns find
    every token of their previous turn cached (from RAM or disk; from disk without RAM); the same run without keys
    (one LRU) finds neither."""
    opts: dict[str, Any] = {"n_ctx": 512, "n_threads": 1, "cache_ram_mib": ram_mib, "disk_limit_mib": 3}
    for keyed in (True, False):
        sid: Callable[[str, str], str] = (lambda k, s: f"{k}@{s}") if keyed else (lambda k, s: f"{k}-{s}")
        async with Runtime.open(smollm2_path, data_dir=tmp_path / str(keyed), **opts) as rt:
            first = {}
            for s in ("1", "2"):
                await rt.create_session(sid("bob", s), system=_system(f"bob {s}"))
                first[s] = await _turn(rt, sid("bob", s), "Hello there.")
            for s in range(8):
                await rt.create_session(sid("alice", str(s)), system=_system(f"alice {s}"))
                await _turn(rt, sid("alice", str(s)), "Hello there.")
            stats = rt.stats()
            assert stats.disk is not None and stats.disk.evictions > 0, stats.disk  # the disk tier was full
            assert stats.slot.ram_entries >= (2 if ram_mib else 0) and stats.disk.entries >= 2, (stats.slot, stats.disk)
            again = {s: await _turn(rt, sid("bob", s), "And then?") for s in ("1", "2")}
        for s in ("1", "2"):
            found = again[s].usage.cached_tokens
            before = first[s].usage.prompt_tokens + first[s].usage.generated_tokens
            if keyed:
                assert found == before, (s, found, before)
                assert again[s].cache_source in (("ram", "disk") if ram_mib else ("disk",)), again[s].cache_source
            else:
                assert found < before, (s, found, before)  # one LRU: alice's states pushed bob's out
