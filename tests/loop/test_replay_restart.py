"""Replay records across a restart (runtime.loop.replay_disk): a real `turnstile serve --data-dir` answers a tool
call, is stopped and started again on the same data dir, and the client resends the whole input with the call
(Codex's `store: false`). The first turn after the restart reads the first turn's prompt and reply from the
disk tier (the reply as the tokens generated for it); with the records removed before the restart the
re-rendered call breaks the prefix there. Plus the records' rules: per namespace, bounded, refused when
damaged or from another model.
"""

from __future__ import annotations

import json
import zlib
from array import array
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from runtime.log import capture_logs
from runtime.loop.replay import Replay
from runtime.loop.replay_disk import DiskRecords
from tests.support.process import ServeProcess

CALL = '{"name":"read_file","arguments":{"path":"notes.txt"}}'  # the template re-serializes it with spaces
ANSWER = "The notes say hello."
SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
TOOLS = [{"type": "function", "name": "read_file", "description": "Read a file.", "parameters": SCHEMA}]
ASK: list[dict[str, Any]] = [
    {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Read notes.txt."}]},
]


def post(url: str, items: list[dict[str, Any]]) -> dict[str, Any]:
    body = {"model": "local", "tools": TOOLS, "store": False, "temperature": 0, "input": items}
    r = httpx.post(url + "/v1/responses", json=body, timeout=300)
    r.raise_for_status()
    out: dict[str, Any] = r.json()
    return out


@pytest.mark.parametrize("records", [True, False], ids=["with-records", "records-removed"])
def test_the_first_turn_after_a_restart_replays_the_generated_call(caller: Path, tmp_path: Path, records: bool) -> None:
    data = tmp_path / "data"
    serve = ("--model", caller, "--threads", "1", "--ctx", "2048", "--data-dir", data)
    with ServeProcess(*serve) as srv:
        first = post(srv.url, ASK)
    call = first["output"][-1]
    assert call["type"] == "function_call" and json.loads(call["arguments"]) == {"path": "notes.txt"}
    held = first["usage"]["input_tokens"] + first["usage"]["output_tokens"]  # what the slot held after the turn
    kept = sorted((data / "replay").rglob("*.rec"))
    assert len(kept) == 1  # the turn's record, written beside the disk tier
    if not records:
        kept[0].unlink()
    items = [
        *ASK,
        {k: call[k] for k in ("type", "call_id", "name", "arguments")},
        {"type": "function_call_output", "call_id": call["call_id"], "output": "hello"},
    ]
    with ServeProcess(*serve) as srv:  # restarted on the same data dir
        second = post(srv.url, items)
    assert second["output"][-1]["content"][0]["text"] == ANSWER
    cached = second["usage"]["input_tokens_details"]["cached_tokens"]
    if records:
        assert cached == held  # the whole first turn from the disk tier: only the tool result is prefilled
    else:
        # re-rendered call: the prefix ends after `<tool_call>`, the call's text is spelled otherwise
        assert cached == first["usage"]["input_tokens"] + 1 < held


def _records(tmp_path: Path, n_vocab: int = 100, fingerprint: str = "m1") -> DiskRecords:
    return DiskRecords(tmp_path / "replay", fingerprint=fingerprint, n_vocab=n_vocab, max_tokens=1 << 20)


def test_records_are_per_namespace_bounded_and_reloaded(tmp_path: Path) -> None:
    def same(a: Any, b: Any) -> bool:
        return True

    r = Replay(max_turns=2, disk=_records(tmp_path))
    r.remember([1, 2, 3], [7, 8, 9], at_eog=True, namespace="alice")
    r.remember([1, 2, 3], [5, 9], at_eog=True, namespace="bob")
    assert r.splice([1, 2, 3, 4, 9, 6], same, "alice").tokens == [1, 2, 3, 7, 8, 9, 6]
    assert r.splice([1, 2, 3, 4, 9, 6], same, "bob").tokens == [1, 2, 3, 5, 9, 6]
    assert r.splice([1, 2, 3, 4, 9, 6], same, "carol").tokens == [1, 2, 3, 4, 9, 6]  # no other key's turns
    r.remember([4], [5, 9], at_eog=True, namespace="alice")
    r.remember([6], [5, 9], at_eog=True, namespace="alice")  # a third: alice's oldest goes, bob's stays
    assert r.turns("alice") == 2 and r.turns("bob") == 1
    assert len(list((tmp_path / "replay").rglob("*.rec"))) == 3
    again = Replay(max_turns=2, disk=_records(tmp_path))  # a restart: the same turns, in the same order
    assert again.turns("alice") == 2 and again.turns("bob") == 1
    assert again.splice([1, 2, 3, 4, 9, 6], same, "alice").tokens == [1, 2, 3, 4, 9, 6]  # evicted before
    assert again.splice([4, 0, 9], same, "alice").tokens == [4, 5, 9]
    assert again.splice([1, 2, 3, 4, 9, 6], same, "bob").tokens == [1, 2, 3, 5, 9, 6]


def test_damaged_or_foreign_records_are_refused_and_removed(tmp_path: Path) -> None:
    r = Replay(disk=_records(tmp_path))
    r.remember([1, 2, 3], [7, 9], at_eog=True, namespace="a")
    r.remember([1, 2], [8, 9], at_eog=True, namespace="b")
    r.remember([1], [99, 9], at_eog=True, namespace="c")
    files = {f.parent.name: f for f in (tmp_path / "replay").rglob("*.rec")}
    assert set(files) == {"ns-" + n.encode().hex() for n in "abc"}
    damaged = bytearray(files["ns-61"].read_bytes())
    damaged[-1] ^= 0xFF
    files["ns-61"].write_bytes(bytes(damaged))
    moved = files["ns-62"].parent.parent / "ns-63" / files["ns-62"].name  # b's record put in c's folder
    files["ns-62"].rename(moved)
    with capture_logs() as logs:
        again = Replay(disk=_records(tmp_path, n_vocab=50))  # 99 is outside the vocabulary now
        assert again.turns("a") == again.turns("b") == again.turns("c") == 0
    reasons = sorted(e["reason"] for e in logs if e["event"] == "replay.record_refused")
    assert reasons == ["checksum", "namespace", "vocabulary"]
    assert list((tmp_path / "replay").rglob("*.rec")) == []
    r.remember([1], [2, 9], at_eog=True, namespace="a")
    with capture_logs() as logs:
        assert Replay(disk=_records(tmp_path, fingerprint="m2")).turns("a") == 0  # another model's record
    assert [e["reason"] for e in logs if e["event"] == "replay.record_refused"] == ["model"]


def test_the_record_format_is_msgpack_with_a_checksum(tmp_path: Path) -> None:
    Replay(disk=_records(tmp_path)).remember([1, 2], [3, 9], at_eog=True, namespace="k")
    (f,) = (tmp_path / "replay").rglob("*.rec")
    data = f.read_bytes()
    assert data[:4] == b"\xc1TR\x01" and int.from_bytes(data[8:12], "big") == zlib.crc32(data[12:])
    import msgspec

    body = msgspec.msgpack.decode(data[12:])
    assert body == {
        "fingerprint": "m1",
        "namespace": "k",
        "prompt": array("i", [1, 2]).tobytes(),
        "generated": array("i", [3, 9]).tobytes(),
    }
