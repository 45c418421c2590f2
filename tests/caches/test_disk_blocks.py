"""The disk tier with shared blocks (`DiskTier(blocks=DiskBlocks(...))`), model-free.

States written by `tests.support.kvstate_writer` (a cell's bytes follow from the tokens up to it, as a real KV
cache's do), so exact byte counts are known: what is stored once, what eviction frees, what a damaged
or missing block takes with it, what a second tier or a second process on the same directory sees.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from caches.disk.cut import DiskBlocks
from caches.disk.format import KIND_BLOCK, KIND_INDEX, KIND_STATE, record_size, tokens_to_bytes
from caches.disk.store import BLK
from caches.disk.tier import DiskTier
from caches.kvstate import Memory
from runtime.errors import InvalidConfig
from runtime.log import capture_logs
from tests.support.kvstate_writer import CELL_BYTES, kv_state

FP = "model-sha256:0123abcd"
SETTINGS = "n_ctx=8192"
B = 16
SYSTEM = [(5 * i + 1) % 200 for i in range(100)]  # 6 full blocks and 4 cells
HEAD, CKPT = b"slot-header", b"checkpoint-bytes" * 3


def agent(j: int, n: int = 40) -> list[int]:
    return SYSTEM + [1000 + 50 * j + i for i in range(n)]


def payload(tokens: list[int], **kw: Any) -> list[bytes]:
    """What the slot hands the tier: a header, the sequence state (part 1), a checkpoint."""
    return [HEAD, kv_state(tokens, **kw), CKPT]


def whole(tokens: list[int], **kw: Any) -> bytes:
    return b"".join(payload(tokens, **kw))


def tier(path: Path, **kw: Any) -> DiskTier:
    kw.setdefault("blocks", DiskBlocks(Memory.KV, B))
    return DiskTier(path, fingerprint=FP, settings=SETTINGS, **kw)


def block_record() -> int:
    return record_size(KIND_BLOCK, FP, SETTINGS, B, B * CELL_BYTES)


def logical(tokens: list[int]) -> int:
    """What the entry takes stored whole: its whole state record and its index record."""
    n = len(whole(tokens))
    return record_size(KIND_STATE, FP, SETTINGS, len(tokens), n) + record_size(KIND_INDEX, FP, SETTINGS, len(tokens), 0)


def digest(t: DiskTier, tokens: list[int]) -> str:
    return t._digest(tokens_to_bytes(tokens))


def block_rows(t: DiskTier) -> list[str]:
    return [k for k, _ in t._store.scan(BLK, values=False)]


def test_states_sharing_a_prefix_store_its_blocks_once_and_come_back_byte_for_byte(tmp_path: Path) -> None:
    with tier(tmp_path) as t:
        agents = [agent(j) for j in range(8)]
        for toks in agents:
            assert t.put(toks, payload(toks)) is True
        st = t.stats()
        # 140 tokens: 8 full blocks, the first 6 the system prompt's (shared), 2 each agent's own
        assert (st.entries, st.blocks) == (8, 6 + 8 * 2)
        assert (st.blocks_written, st.blocks_shared) == (6 + 8 * 2, 7 * 6)
        assert st.logical_bytes == sum(logical(a) for a in agents)
        own = sum(t._m.items[d].nbytes for d in t._m.items)
        assert st.stored_bytes == st.bytes == t.nbytes == own + st.blocks * block_record()
        assert st.stored_bytes < 0.6 * st.logical_bytes
        for toks in agents:
            got = t.find([*toks, 7, 8])
            assert got is not None
            assert got[0] == toks
            assert bytes(got[1]) == whole(toks)
            assert got[1].readonly


def test_v_transposed_states_round_trip_through_blocks(tmp_path: Path) -> None:
    with tier(tmp_path) as t:
        for j in range(3):
            toks = agent(j, 37)
            assert t.put(toks, payload(toks, v_trans=True))
        assert t.stats().blocks == 6 + 3 * 2
        for j in range(3):
            toks = agent(j, 37)
            got = t.find(toks)
            assert got is not None and bytes(got[1]) == whole(toks, v_trans=True)


def test_a_second_tier_on_the_directory_reads_the_blocks_and_its_removals_keep_shared_ones(tmp_path: Path) -> None:
    a, b = tier(tmp_path), tier(tmp_path)
    try:
        for j in range(3):
            assert a.put(agent(j), payload(agent(j)))
        assert b.put(agent(9), payload(agent(9)))  # B sees A's blocks: only its own 2 are written
        assert b.stats().blocks_written == 2 and b.stats().blocks_shared == 6
        for j in range(3):
            assert a.remove(agent(j)) is True
        assert len(block_rows(a)) == 8  # the system prompt's blocks stay: B's entry lists them
        got = b.find(agent(9))
        assert got is not None and bytes(got[1]) == whole(agent(9))
        assert a.remove(agent(9)) is True
        assert block_rows(a) == [] and b.nbytes == 0 and b.stats().logical_bytes == 0
    finally:
        a.close()
        b.close()


def test_eviction_frees_only_blocks_no_entry_uses_and_the_limit_counts_held_bytes(tmp_path: Path) -> None:
    with tier(tmp_path, limit_bytes=0) as t:
        for j in range(4):
            t.put(agent(j), payload(agent(j)))
        held_4 = t.nbytes
        own_0 = t._m.items[digest(t, agent(0))].nbytes
    with capture_logs() as logs, tier(tmp_path, limit_bytes=held_4 - 1) as t:
        assert len(t) == 3  # reopened under the limit: the least recently used went ...
        assert t.nbytes == held_4 - own_0 - 2 * block_record()  # ... with its 2 own blocks; the shared 6 stay
        assert len(block_rows(t)) == 6 + 3 * 2
        got = t.find(agent(0))
        assert got is not None and got[0] != agent(0)  # another agent's, through the system prompt
        for j in (1, 2, 3):
            got = t.find(agent(j))
            assert got is not None and bytes(got[1]) == whole(agent(j))
    assert [e["event"] for e in logs].count("disk_tier.evicted") == 1


def test_a_damaged_block_makes_every_state_using_it_a_miss_logged_and_removed(tmp_path: Path) -> None:
    with tier(tmp_path) as t:
        for j in range(3):
            t.put(agent(j), payload(agent(j)))
        lone = [3000 + i for i in range(40)]  # shares nothing
        t.put(lone, payload(lone))
        first = t._m.items[digest(t, agent(0))].keys[0]  # a system-prompt block: all three agents use it
        (filename,) = t._store.cache._sql("SELECT filename FROM Cache WHERE key = ?", (BLK + first.hex(),)).fetchone()
        path = tmp_path / filename
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
        with capture_logs() as logs:
            assert t.find(agent(1)) is None
        rejected = [e for e in logs if e["event"] == "disk_tier.rejected"]
        assert [e["reason"] for e in rejected] == ["checksum"] * 3
        assert len(t) == 1 and t.stats().rejected == 3
        assert block_rows(t) == [BLK + k.hex() for k in sorted(t._m.items[digest(t, lone)].keys)]
        got = t.find(lone)
        assert got is not None and bytes(got[1]) == whole(lone)


def test_a_missing_block_file_is_a_miss_and_a_missing_block_row_is_found_at_open(tmp_path: Path) -> None:
    with tier(tmp_path) as t:
        t.put(agent(0), payload(agent(0)))
        t.put(agent(1), payload(agent(1)))
        own = t._m.items[digest(t, agent(1))].keys[-1]  # agent 1's own last block
        (filename,) = t._store.cache._sql("SELECT filename FROM Cache WHERE key = ?", (BLK + own.hex(),)).fetchone()
        (tmp_path / filename).unlink()
        with capture_logs() as logs:
            got = t.find(agent(1))
        assert got is not None and got[0] == agent(0)  # the next best: agent 0's, through the system prompt
        assert bytes(got[1]) == whole(agent(0))
        assert [e["reason"] for e in logs if e["event"] == "disk_tier.rejected"] == ["missing"]
        assert len(t) == 1
        gone = t._m.items[digest(t, agent(0))].keys[-1]
        t._store.cache._sql("DELETE FROM Cache WHERE key = ?", (BLK + gone.hex(),))  # the row itself, behind its back
    with capture_logs() as logs, tier(tmp_path) as t:
        assert len(t) == 0 and block_rows(t) == []
    assert [e["reason"] for e in logs if e["event"] == "disk_tier.rejected"] == ["missing"]


def test_orphaned_blocks_are_collected_at_open(tmp_path: Path) -> None:
    with tier(tmp_path) as t:
        t.put(agent(0), payload(agent(0)))
        t._store.put(BLK + "ab" * 16, b"an orphan")
        t._store.put(BLK + "not hex", b"another")
        assert len(block_rows(t)) == 8 + 2
    with capture_logs() as logs, tier(tmp_path) as t:
        assert len(block_rows(t)) == 8 and len(t) == 1
        assert t.find(agent(0)) is not None
    assert [e["count"] for e in logs if e["event"] == "disk_tier.orphan_blocks_removed"] == [2]


def test_a_state_kvstate_does_not_know_is_stored_whole_and_logged_once(tmp_path: Path) -> None:
    with capture_logs() as logs, tier(tmp_path) as t:
        odd = [HEAD, b"not a llama.cpp state" * 10, CKPT]
        for j in range(2):
            assert t.put(agent(j), odd) is True
        assert t.put(agent(5), [b"one buffer only"]) is True  # no part 1 to cut
        st = t.stats()
        assert (st.whole_states, st.blocks, st.logical_bytes) == (3, 0, st.bytes)
        got = t.find(agent(1))
        assert got is not None and bytes(got[1]) == b"".join(odd)
    events = [e for e in logs if e["event"] == "disk_tier.whole"]
    assert [e["log_level"] for e in events] == ["info", "debug", "info"]


def test_replacing_an_entry_with_the_same_tokens_keeps_its_shared_blocks(tmp_path: Path) -> None:
    with tier(tmp_path) as t:
        toks = agent(0)
        t.put(toks, payload(toks))
        t.put(toks, payload(toks, salt=b"other bytes"))  # same tokens, other cells: its blocks are the first's
        assert len(t) == 1 and t.stats().blocks == 8
        t.put(toks, [b"whole now"])
        assert t.stats().blocks == 0 and block_rows(t) == []
        got = t.find(toks)
        assert got is not None and bytes(got[1]) == b"whole now"
        t.put(SYSTEM[:50], payload(SYSTEM[:50]))
        t.put(SYSTEM, payload(SYSTEM))  # holds the first whole: it goes, their 3 shared blocks stay
        assert len(t) == 2 and t.stats().replaced == 1 and t.stats().blocks == 6


def test_a_state_larger_than_the_limit_with_its_blocks_is_refused(tmp_path: Path) -> None:
    with tier(tmp_path, limit_bytes=6 * block_record()) as t:
        assert t.put(agent(0), payload(agent(0))) is False
        assert len(t) == 0 and block_rows(t) == []


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_a_block_size_that_is_not_a_positive_int_is_refused(bad: Any) -> None:
    with pytest.raises(InvalidConfig):
        DiskBlocks(Memory.KV, bad)


_WRITER = """
import sys
from caches.disk.tier import DiskTier, DiskBlocks
from caches.kvstate import Memory
from tests.caches.test_disk_blocks import FP, SETTINGS, B, agent, payload
base = int(sys.argv[2])
with DiskTier(sys.argv[1], fingerprint=FP, settings=SETTINGS, blocks=DiskBlocks(Memory.KV, B)) as t:
    for j in range(base, base + 12):
        assert t.put(agent(j), payload(agent(j)))
"""


def test_two_processes_writing_shared_blocks_lose_nothing(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path), str(base)], cwd=root) for base in (0, 100)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    with tier(tmp_path) as t:
        assert len(t) == 24 and t.stats().blocks == 6 + 24 * 2
        for base in (0, 100):
            for j in range(base, base + 12):
                got = t.find(agent(j))
                assert got is not None and bytes(got[1]) == whole(agent(j))


_KILLED_WRITER = """
import os, signal, sys
import caches.disk.entry as e
import caches.disk.tier as m
from caches.disk.format import PartsReader
from caches.disk.cut import DiskBlocks
from caches.kvstate import Memory
from tests.caches.test_disk_blocks import FP, SETTINGS, B, agent, payload

n = [0]
class Dies(PartsReader):
    def read(self, n_=-1):
        chunk = super().read(n_)
        if not chunk:
            n[0] += 1
            if n[0] == int(sys.argv[2]):
                os.kill(os.getpid(), signal.SIGKILL)  # files written, rows not committed
        return chunk

t = m.DiskTier(sys.argv[1], fingerprint=FP, settings=SETTINGS, blocks=DiskBlocks(Memory.KV, B))
m.PartsReader = e.PartsReader = Dies
t.put(agent(7, 70), payload(agent(7, 70)))
"""


@pytest.mark.parametrize("at", [1, 3, 5])  # after its first block, a later block, its state record
def test_a_writer_killed_mid_save_leaves_no_block_and_no_state_after_reopening(tmp_path: Path, at: int) -> None:
    with tier(tmp_path) as t:
        assert t.put(agent(0), payload(agent(0)))
        before = (len(t), t.nbytes, sorted(block_rows(t)))
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(tmp_path), str(at)], cwd=root)
    assert proc.returncode == -9
    with capture_logs() as logs, tier(tmp_path) as t:
        assert (len(t), t.nbytes, sorted(block_rows(t))) == before
        got = t.find(agent(0))
        assert got is not None and bytes(got[1]) == whole(agent(0))
    assert [e["count"] for e in logs if e["event"] == "disk_tier.orphan_files_removed"] == [at]
    assert len(list(tmp_path.rglob("*.val"))) == 1 + 8


@pytest.mark.parametrize("row", ["manifest", "block"])
def test_a_pickled_manifest_or_block_row_is_refused_and_never_unpickled(tmp_path: Path, row: str) -> None:
    import diskcache

    from caches.disk.store import MAN
    from tests.caches.test_disk_tier_faults import Planted

    with tier(tmp_path) as t:
        for j in range(2):
            t.put(agent(j), payload(agent(j)))
        d = digest(t, agent(0))
        first = t._m.items[d].keys[0]  # a prefix block: both agents list it
    marker = tmp_path.parent / f"{tmp_path.name}-unpickled"
    key = MAN + d if row == "manifest" else BLK + first.hex()
    with diskcache.Cache(str(tmp_path)) as raw:  # plain diskcache pickles what is not bytes/str/int
        raw.set(key, Planted(marker))
    with capture_logs() as logs, tier(tmp_path) as t:
        got = t.find(agent(0))
        n = len(t)
        rows = block_rows(t)
    assert not marker.exists()
    rejected = [e["reason"] for e in logs if e["event"] == "disk_tier.rejected"]
    if row == "manifest":  # agent 0 goes at open; agent 1 is found through the prefix, byte for byte
        assert rejected == ["unsafe"] and n == 1
        assert got is not None and got[0] == agent(1) and bytes(got[1]) == whole(agent(1))
        assert len(rows) == 8
    else:  # both list the block: both go, and every block with them
        assert rejected == ["unsafe", "unsafe"] and n == 0 and got is None
        assert rows == []


def test_a_damaged_state_record_of_a_blocked_entry_is_a_miss_and_frees_only_its_own_blocks(tmp_path: Path) -> None:
    from caches.disk.store import REC

    with tier(tmp_path) as t:
        for j in range(2):
            t.put(agent(j), payload(agent(j)))
        d = digest(t, agent(0))
        (filename,) = t._store.cache._sql("SELECT filename FROM Cache WHERE key = ?", (REC + d,)).fetchone()
        path = tmp_path / filename
        data = bytearray(path.read_bytes())
        data[-10] ^= 0x40  # in the partial block's cells
        path.write_bytes(bytes(data))
        with capture_logs() as logs:
            got = t.find(agent(0))
        assert [e["reason"] for e in logs if e["event"] == "disk_tier.rejected"] == ["checksum"]
        assert got is not None and got[0] == agent(1) and bytes(got[1]) == whole(agent(1))
        assert len(t) == 1 and len(block_rows(t)) == 8  # agent 0's 2 own blocks went, the prefix's stayed


@pytest.mark.parametrize("n", [B, 3 * B, 3 * B + 1, 1])
def test_states_of_whole_blocks_only_or_less_than_one_round_trip(tmp_path: Path, n: int) -> None:
    with tier(tmp_path) as t:
        toks = [7 * i + 1 for i in range(n)]
        for v_trans in (False, True):
            assert t.put(toks, payload(toks, v_trans=v_trans))
            assert t.stats().blocks == n // B and t.stats().whole_states == 0
            got = t.find(toks)
            assert got is not None and bytes(got[1]) == whole(toks, v_trans=v_trans)
