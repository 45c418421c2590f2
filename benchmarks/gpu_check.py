"""`python -m benchmarks gpu-check`: everything that should be checked on a GPU, in one command, with `-ngl 99`.

For whoever has a GPU and a CUDA (or Metal, Vulkan, ROCm) build of llama-cpp-python and llama-server
(docs/hardware.md: `CMAKE_ARGS="-DGGML_CUDA=on" make install` and `make oracle` with the same CMAKE_ARGS).
In order, each a subprocess whose output is shown and whose exit status is reported at the end:

1. the build: does this llama.cpp offload at all (`llama_supports_gpu_offload`)? Without a GPU backend the
   check stops here (exit 2) unless `--allow-cpu` (a dry run of the script itself on a CPU machine);
2. the parity oracle (`tests/slot/test_parity_oracle.py`), both sides with `-ngl 99` (TURNSTILE_TEST_GPU_LAYERS):
   the same texts and token counts as llama-server on the GPU;
3. the benchmarks with `-ngl 99`: `interleaved`, `pressure --cache-type f16,q8_0`, `restart`,
   `long-restart` (a 6,000-token conversation resumed from the disk tier vs recomputed) and `swap` (state
   save/restore GB/s: on a GPU, device to host and back), each beside llama-server when `--llama-server`
   (default: TURNSTILE_LLAMA_SERVER) is given.

JSON of every benchmark goes to `--out` (default benchmarks/results). `--quick` uses short settings (a
smoke run of a few minutes); without it the benchmarks run their defaults.

    python -m benchmarks gpu-check [-ngl 99] [--model PATH] [--llama-server BIN] [--out DIR] [--quick] [--allow-cpu]
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import _cli

ROOT = Path(__file__).resolve().parents[1]


def _offload_supported() -> bool:
    code = "import llama_cpp; llama_cpp.llama_backend_init(); print(int(llama_cpp.llama_supports_gpu_offload()))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return r.stdout.strip().endswith("1")


def steps(ngl: int, model: str | None, server: str | None, out: str, quick: bool) -> list[tuple[str, list[str]]]:
    """(name, command) of every step after the build check."""
    py = sys.executable
    common = ["-ngl", str(ngl), "--out", out, *(["--model", model] if model else [])]
    both = [*common, *(["--llama-server", server] if server else [])]
    short = ["--conversations", "3", "--turns", "2", "--max-tokens", "16"] if quick else []
    return [
        ("parity oracle", [py, "-m", "pytest", "-q", "-x", "tests/slot/test_parity_oracle.py"]),
        ("interleaved", [py, "-m", "benchmarks", "interleaved", *both, *short]),
        ("pressure f16 + q8_0", [py, "-m", "benchmarks", "pressure", *both, *short, "--cache-type", "f16,q8_0"]),
        ("restart", [py, "-m", "benchmarks", "restart", *both, *(short[:2] if quick else [])]),
        ("long-restart", [py, "-m", "benchmarks", "long-restart", *both, *(["--repeat", "1"] if quick else [])]),
        ("swap", [py, "-m", "benchmarks", "swap", *common, *(["--repeat", "2"] if quick else [])]),
    ]


def main(argv: list[str]) -> None:
    ap = _cli.parser("gpu-check", __doc__)
    ap.add_argument("-ngl", "--n-gpu-layers", type=int, default=99, help="GPU layers on every side (default 99)")
    ap.add_argument("--model", default=None, help="GGUF file (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--llama-server", default=os.environ.get("TURNSTILE_LLAMA_SERVER"), metavar="BIN")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"), metavar="DIR")
    ap.add_argument("--quick", action="store_true", help="short settings: a smoke run")
    ap.add_argument("--allow-cpu", action="store_true", help="go on without a GPU backend (a dry run)")
    args = ap.parse_args(argv)
    _cli.check_binary(ap, args.llama_server)
    gpu = _offload_supported()
    print(f"gpu-check: this llama.cpp build {'can' if gpu else 'CANNOT'} offload to a GPU", flush=True)
    if not gpu and not args.allow_cpu:
        print("gpu-check: rebuild with CMAKE_ARGS='-DGGML_CUDA=on' make install (docs/hardware.md)", file=sys.stderr)
        raise SystemExit(2)
    env = {**os.environ, "TURNSTILE_TEST_GPU_LAYERS": str(args.n_gpu_layers)}
    if args.llama_server:
        env["TURNSTILE_LLAMA_SERVER"] = args.llama_server
    results: list[tuple[str, int, float]] = []
    for name, cmd in steps(args.n_gpu_layers, args.model, args.llama_server, args.out, args.quick):
        print(f"\n=== {name}: {' '.join(cmd)}", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.run(cmd, cwd=ROOT, env=env).returncode
        results.append((name, rc, time.perf_counter() - t0))
    print("\ngpu-check summary (-ngl {}, GPU offload {}):".format(args.n_gpu_layers, "yes" if gpu else "NO"))
    for name, rc, seconds in results:
        print(f"  {'ok  ' if rc == 0 else 'FAIL'} {name:<22} {seconds:7.1f} s")
    raise SystemExit(0 if all(rc == 0 for _, rc, _ in results) else 1)
