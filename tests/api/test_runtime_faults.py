"""The Runtime over a data_dir that cannot be used: a states directory that is not one runs without the
disk tier (a warning says why); a sessions store that cannot be opened is a typed error."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime import Runtime
from runtime.log import capture_logs
from sessions import StoreUnavailable

OPTS = {"n_ctx": 512, "n_threads": 1, "cache_ram_mib": 16}


async def test_unusable_states_directory_runs_without_the_disk_tier(tiny_llama: Path, tmp_path: Path) -> None:
    (tmp_path / "states").write_bytes(b"not a directory")
    with capture_logs() as logs:
        async with Runtime.open(tiny_llama, data_dir=tmp_path, **OPTS) as rt:
            reply = await rt.chat("a", "hello", max_tokens=4, temperature=0.0)
            assert rt.stats().disk is None
    assert reply.finish_reason in ("stop", "length")
    warned = [e for e in logs if e["event"] == "runtime.disk_tier_unavailable"]
    assert len(warned) == 1 and warned[0]["log_level"] == "warning"
    assert (tmp_path / "states").read_bytes() == b"not a directory"


async def test_unusable_sessions_store_is_a_typed_error(tiny_llama: Path, tmp_path: Path) -> None:
    (tmp_path / "sessions").write_bytes(b"not a directory")
    with pytest.raises(StoreUnavailable):
        async with Runtime.open(tiny_llama, data_dir=tmp_path, **OPTS):
            pass  # pragma: no cover


async def test_a_grammar_llama_cpp_cannot_parse_is_refused_before_queueing(tiny_llama: Path) -> None:
    from runtime import InvalidRequest

    async with Runtime.open(tiny_llama, **OPTS) as rt:
        with pytest.raises(InvalidRequest):
            await rt.chat("g", "hi", grammar='root ::= ("unclosed')
        assert rt.stats().scheduler.submitted == 0
        r = await rt.chat("g", "hi", grammar='root ::= "yes" | "no"', max_tokens=8, temperature=0.0)
        assert r.text in ("yes", "no") and r.finish_reason == "stop"
