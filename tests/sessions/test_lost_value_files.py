"""A stored row whose value file is gone (or cut short) is damaged, never absent.

diskcache keeps a value at or over its `disk_min_file_size` (32 KB by default) in a file beside its
database, and on its own reads a row whose file is missing as no row at all. A session store keeps every
record inside SQLite, but a directory written with diskcache's default settings (another configuration, an
older build) holds long records as files; a lost file must then be `SessionCorrupt` for that session, the
others must answer, and `import_(overwrite=True)` must recover it. On the disk tier a lost state file is a
miss, logged, and its row is removed.
"""

from __future__ import annotations

from pathlib import Path

import diskcache
import pytest

from caches.disk.tier import DiskTier
from runtime import Runtime
from runtime.errors import MissingValueFile, SessionCorrupt
from runtime.log import capture_logs
from runtime.testing import ScriptedBackend
from sessions import DiskStore
from sessions.raw_disk import RawDisk
from sessions.record import encode_record

LONG = "a long conversation " * 4000  # an 80 KB system message: a record over diskcache's 32 KB


def _store_as_file(directory: Path, store: DiskStore, sid: str) -> Path:
    """Rewrite `sid`'s record the way diskcache stores a long value by default: in a value file."""
    record = encode_record(store.get(sid))
    plain = diskcache.Cache(str(directory), disk=RawDisk, disk_min_file_size=1 << 15, eviction_policy="none")
    try:
        plain.set(sid, record)
        (filename,) = plain._sql("SELECT filename FROM Cache WHERE key = ?", (sid,)).fetchone()
    finally:
        plain.close()
    assert filename is not None  # the record now lives beside the database
    return directory / filename


def _long_sessions(directory: Path) -> tuple[DiskStore, Path]:
    store = DiskStore(directory)
    store.create("long", system=LONG)
    store.append_turn("long", "hello", "hi there")
    store.create("other", system="short")
    value = _store_as_file(directory, store, "long")
    store.close()
    return DiskStore(directory), value


@pytest.mark.parametrize("damage", ["missing", "short"])
def test_a_lost_value_file_is_session_corrupt_and_import_recovers_it(tmp_path: Path, damage: str) -> None:
    store, value = _long_sessions(tmp_path)
    exported = store.export("long")  # readable while its file is there
    if damage == "missing":
        value.unlink()
    else:
        value.write_bytes(value.read_bytes()[:1000])
    with capture_logs() as logs:
        with pytest.raises(SessionCorrupt) as err:
            store.get("long")
        with pytest.raises(SessionCorrupt):
            store.export("long")
    assert err.value.session_id == "long"
    assert ("missing or unreadable" in err.value.reason) == (damage == "missing")
    assert [e["event"] for e in logs] == ["session.corrupt", "session.corrupt"]
    assert store.exists("long")  # the row is there: create() cannot silently start it over
    assert store.get("other").system == "short"
    assert store.list() == ["long", "other"]
    recovered = store.import_(exported, overwrite=True)
    assert recovered.messages == store.get("long").messages
    long = store.get("long")
    assert (long.system, [m.content for m in long.messages]) == (LONG, ["hello", "hi there"])
    store.close()


async def test_a_runtime_turn_on_a_session_with_a_lost_file_raises_and_changes_nothing(tmp_path: Path) -> None:
    store, value = _long_sessions(tmp_path)
    exported = store.export("long")
    value.unlink()
    backend = ScriptedBackend()
    async with Runtime.serve(backend, store) as rt:
        with pytest.raises(SessionCorrupt):
            await rt.chat("long", "are you there?")
        with pytest.raises(SessionCorrupt):
            await rt.export("long")
        assert backend.stats().requests == 0  # nothing ran on the slot
        reply = await rt.chat("other", "hello")  # the other sessions answer
        assert reply.text
        await rt.import_(exported, overwrite=True)
        long = await rt.get_session("long")
        assert (long.system, [m.content for m in long.messages]) == (LONG, ["hello", "hi there"])
        reply = await rt.chat("long", "are you there?")
        assert (await rt.get_session("long")).messages[-1].content == reply.text


def test_raw_disk_raises_for_a_missing_value_file_where_diskcache_would_return_nothing(tmp_path: Path) -> None:
    cache = diskcache.Cache(str(tmp_path), disk=RawDisk, disk_min_file_size=16)
    try:
        cache.set("k", b"x" * 64)
        (filename,) = cache._sql("SELECT filename FROM Cache WHERE key = 'k'").fetchone()
        (tmp_path / filename).unlink()
        with pytest.raises(MissingValueFile) as err:
            cache.get("k")
        assert err.value.filename == filename
        plain = diskcache.Cache(str(tmp_path / "plain"), disk_min_file_size=16)
        plain.set("k", b"x" * 64)
        (name,) = plain._sql("SELECT filename FROM Cache WHERE key = 'k'").fetchone()
        (tmp_path / "plain" / name).unlink()
        assert plain.get("k") is None  # what RawDisk prevents: the row reads as absent
        plain.close()
    finally:
        cache.close()


def test_the_disk_tier_logs_a_lost_state_file_as_a_miss_and_removes_the_row(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, fingerprint="fp", settings="s")
    try:
        kept, lost = list(range(0, 40)), list(range(100, 140))
        tier.put(kept, b"k" * (64 << 10))
        tier.put(lost, b"l" * (64 << 10))
        files = sorted(tmp_path.rglob("*.val"))
        assert len(files) == 2
        by_content = {f.read_bytes().count(b"l") > (60 << 10): f for f in files}
        by_content[True].unlink()
        with capture_logs() as logs:
            assert tier.find(lost) is None
        assert [(e["event"], e["reason"]) for e in logs if e["event"] == "disk_tier.rejected"] == [
            ("disk_tier.rejected", "missing")
        ]
        assert tier.find(lost) is None  # the row is gone: not rejected again
        found = tier.find(kept)
        assert found is not None and bytes(found[1]) == b"k" * (64 << 10)
        assert tier.stats().entries == 1
    finally:
        tier.close()
