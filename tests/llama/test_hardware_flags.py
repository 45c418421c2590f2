"""llama-server's hardware flags reach llama.cpp: quantized KV caches (`-ctk/-ctv`), flash attention (`-fa`),
GPU layers (`-ngl`, reported as 0 with a warning on this CPU-only build), mmap/mlock; what llama.cpp refuses is
refused clearly; states record their KV types (a state saved with f16 is refused after a restart with q8_0).

q8_0 needs a head size its 32-value blocks divide: SmolLM2-135M (64) has one, the tiny test models (16) do not.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from runtime import Runtime
from runtime.config import EngineConfig
from runtime.errors import InvalidConfig, ModelLoadError
from runtime.llama.engine import Engine
from runtime.log import capture_logs
from tests.support.tiny_models import write_llama

ROOT = Path(__file__).resolve().parents[2]
GEN = {"temperature": 0.0, "max_tokens": 4}
Q8 = {"type_k": "q8_0", "type_v": "q8_0", "flash_attn": "on"}


def test_engine_config_checks() -> None:
    assert EngineConfig(flash_attn="on").flash_attn is True
    assert EngineConfig(flash_attn="off").flash_attn is False
    assert EngineConfig(flash_attn="auto").flash_attn_name == "auto"
    assert "fa=auto" in EngineConfig(flash_attn="auto").settings_key()
    assert "fa=1" in EngineConfig().settings_key() and "type_k=q8_0" in EngineConfig(type_k="q8_0").settings_key()
    with pytest.raises(InvalidConfig, match=r"quantized V cache \(type_v=q8_0\) needs flash attention"):
        EngineConfig(type_v="q8_0", flash_attn=False)
    EngineConfig(type_k="q8_0", flash_attn=False)  # a quantized K cache alone does not need it
    with pytest.raises(InvalidConfig, match="type_k must be one of f32, f16, bf16, q8_0"):
        EngineConfig(type_k="q3_k")
    for bad in ({"flash_attn": "maybe"}, {"n_gpu_layers": -2}, {"n_threads": 0}, {"n_gpu_layers": True}):
        with pytest.raises(InvalidConfig):
            EngineConfig(**bad)  # type: ignore[arg-type]


async def test_runtime_open_refuses_before_loading(tiny_llama: Path) -> None:
    with pytest.raises(InvalidConfig, match="needs flash attention"):
        async with Runtime.open(tiny_llama, type_v="q4_0", flash_attn=False):
            pass
    with pytest.raises(InvalidConfig, match="model and hf"):
        async with Runtime.open(tiny_llama, hf="org/repo"):
            pass


def test_llama_cpp_refusal_is_explained(tiny_llama: Path) -> None:
    """The tiny llama's heads are 16 wide: llama.cpp refuses q8_0 (32-value blocks); its reason is in the error."""
    with pytest.raises(ModelLoadError, match=r"K cache type q8_0 with block size 32 does not divide n_embd_head_k=16"):
        Engine(tiny_llama, EngineConfig(n_ctx=256, n_threads=1, type_k="q8_0"))


async def test_gpu_layers_on_a_cpu_build(tiny_llama: Path) -> None:
    with capture_logs() as logs:
        async with Runtime.open(tiny_llama, n_ctx=256, n_threads=1, n_gpu_layers=99, use_mlock=True) as rt:
            info = rt.engine_info()
    assert (info.n_gpu_layers, info.n_gpu_layers_requested, info.gpu_offload) == (0, 99, False)
    assert (info.n_layer, info.type_k, info.type_v, info.flash_attn, info.use_mlock) == (2, "f16", "f16", "on", True)
    warned = [e for e in logs if e["event"] == "engine.no_gpu_offload"]
    assert len(warned) == 1 and warned[0]["log_level"] == "warning" and warned[0]["n_gpu_layers"] == 99


def _kv_bytes_per_token(eng: Engine) -> int:
    """Per cell: 12 bytes of metadata, and each layer's K and V rows (n_head_kv x head size values each)."""
    arch = eng.meta("general.architecture")
    n_embd, n_head = int(eng.meta(f"{arch}.embedding_length") or 0), int(eng.meta(f"{arch}.attention.head_count") or 0)
    width = int(eng.meta(f"{arch}.attention.head_count_kv") or 0) * (n_embd // n_head)
    row = {"f16": 2 * width, "q8_0": width // 32 * 34}[eng.config.type_k]
    return 12 + eng.n_layer * 2 * row


@pytest.mark.slow
def test_q8_0_states_are_q8_0_sized(smollm2_path: Path, make_engine: object) -> None:
    sizes: dict[str, tuple[int, int]] = {}
    for kind, extra in (("f16", {}), ("q8_0", Q8)):
        eng = make_engine(smollm2_path, EngineConfig(n_ctx=256, n_threads=1, **extra))  # type: ignore[operator]
        assert eng.config.type_k == kind
        tokens = eng.tokenize("The quick brown fox jumps over the lazy dog. " * 8)[:80]
        assert len(tokens) == 80
        eng.decode(tokens[:20], 0)
        small = eng.state_size()
        eng.decode(tokens[20:], 20)  # 60 more cells
        sizes[kind] = (eng.state_size() - small, _kv_bytes_per_token(eng) * 60)
    assert sizes["f16"][0] == sizes["f16"][1] == 60 * (12 + 30 * 2 * 384)  # 23,052 bytes a token
    assert sizes["q8_0"][0] == sizes["q8_0"][1] == 60 * (12 + 30 * 2 * 204)  # 12,252 bytes a token
    assert round(sizes["q8_0"][0] / sizes["f16"][0], 3) == 0.531  # 34 bytes per 32 values against 64


@pytest.mark.slow
async def test_state_of_another_kv_type_is_refused_after_restart(smollm2_path: Path, tmp_path: Path) -> None:
    opts = {"n_ctx": 512, "n_threads": 1, "data_dir": tmp_path}
    async with Runtime.open(smollm2_path, **opts) as rt:  # f16
        await rt.create_session("s")
        first = await rt.chat("s", "Name three colours.", **GEN)
        assert first.cache_source == "none"
    with capture_logs() as logs:
        async with Runtime.open(smollm2_path, **opts, **Q8) as rt:  # type: ignore[arg-type]
            assert (rt.engine_info().type_k, rt.engine_info().type_v) == ("q8_0", "q8_0")
            r = await rt.chat("s", "And three animals.", **GEN)
            q8_stats = rt.stats()
    assert r.cache_source == "none" and r.usage.cached_tokens == 0  # recomputed, not loaded
    assert r.usage.prefilled_tokens == r.usage.prompt_tokens
    rejected = [e for e in logs if e["event"] == "disk_tier.rejected"]
    assert rejected and all("settings" in str(e.get("reason")) for e in rejected)
    assert q8_stats.slot.disk_loads == 0 and q8_stats.disk is not None and q8_stats.disk.rejected >= 1
    async with Runtime.open(smollm2_path, **opts, **Q8) as rt:  # type: ignore[arg-type]
        r = await rt.chat("s", "And three trees.", **GEN)  # its own q8_0 state is loaded from disk
    assert r.cache_source == "disk" and r.usage.cached_tokens > 0


async def test_the_same_ram_holds_twice_the_q8_0_states(tmp_path: Path) -> None:
    """Ten conversations of ~830 tokens through a 1 MiB RAM cache: four f16 states fit, eight q8_0 ones (a q8_0
    cell of this model is 148 bytes against 268). The model's heads are 32 wide, so q8_0 fits them."""
    model = write_llama(tmp_path / "heads32.gguf", n_head=2, n_ctx=2048)
    held: dict[str, tuple[int, int]] = {}
    for kv in ("f16", "q8_0"):
        async with Runtime.open(model, n_ctx=2048, n_threads=1, cache_ram_mib=1, type_k=kv, type_v=kv) as rt:
            for i in range(10):
                words = " ".join(f"w{i}x{j}" for j in range(150))
                await rt.create_session(f"s{i}", system=f"conversation {i} {words}")
                r = await rt.chat(f"s{i}", "hello there", **GEN)
                assert r.usage.prompt_tokens == 837 and r.usage.cached_tokens <= 18  # a shared head only
            st = rt.stats().slot
        held[kv] = (st.ram_entries, st.ram_bytes)
        assert st.ram_bytes <= 1 << 20
    assert held["f16"][0] == 4 and held["q8_0"][0] == 8
    per_state = {kv: n_bytes / n for kv, (n, n_bytes) in held.items()}
    assert 0.53 < per_state["q8_0"] / per_state["f16"] < 0.56


def test_cli_flags_reach_the_engine(tiny_llama: Path) -> None:
    """`turnstile chat` with llama-server's spellings: the engine logs what it got."""
    cmd = [sys.executable, "-m", "runtime.cli", "chat", "--model", str(tiny_llama), "-v", "-t", "1", "-c", "256"]
    flags = ["-ngl", "all", "-ctk", "bf16", "-ctv", "f16", "-fa", "auto", "--no-mmap", "--mlock", "--max-tokens", "2"]
    r = subprocess.run([*cmd, *flags], input="hi\n", capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    loaded = next(line for line in r.stderr.splitlines() if "engine.loaded" in line)
    for part in ("type_k=bf16", "type_v=f16", "flash_attn=auto", "n_gpu_layers=0", "n_ctx=256", "n_threads=1"):
        assert part in loaded, loaded
    assert "engine.no_gpu_offload" in r.stderr
    r = subprocess.run([*cmd, "-ctv", "q8_0", "-fa", "off"], input="", capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "quantized V cache (type_v=q8_0) needs flash attention" in r.stderr
    r = subprocess.run([*cmd, "-ctk", "q3_k"], input="", capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "invalid choice: 'q3_k'" in r.stderr
    r = subprocess.run([*cmd, "-ctk", "q8_0"], input="hi\n", capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 2 and "does not divide n_embd_head_k=16" in r.stderr


def test_gpu_check_stops_on_a_cpu_build(capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m benchmarks gpu-check` asks the build first: this one cannot offload, so it stops (exit 2)."""
    from benchmarks import gpu_check

    with pytest.raises(SystemExit) as stopped:
        gpu_check.main([])
    assert stopped.value.code == 2
    assert "CANNOT offload" in capsys.readouterr().out
    steps = dict(gpu_check.steps(99, None, "/bin/llama-server", "/tmp/out", quick=True))
    assert list(steps) == ["parity oracle", "interleaved", "pressure f16 + q8_0", "restart", "long-restart", "swap"]
    for name, cmd in steps.items():
        assert name == "parity oracle" or cmd[cmd.index("-ngl") + 1] == "99"
    assert steps["pressure f16 + q8_0"][-2:] == ["--cache-type", "f16,q8_0"]
