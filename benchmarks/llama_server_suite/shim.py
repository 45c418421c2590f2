"""The shim the suite starts in place of llama-server: `python -m benchmarks.llama_server_suite.shim TARGET ARGS`.

TARGET "llama-server": the real binary ($TURNSTILE_LLAMA_SERVER) with the suite's model names replaced by
local files (`models.SUBSTITUTES`); everything else passes unchanged. TARGET "turnstile": `turnstile serve`
with llama-server's command line mapped onto its flags:

- RENAMED: llama-server's flag -> turnstile serve's (same meaning, another spelling);
- ACCEPTED: flags that change no reply and nothing the suite can observe of one slot's answers (each with
  the reason), dropped;
- any other flag that `turnstile serve` has under the same name passes unchanged (so flags added to
  `turnstile serve` later, such as llama-server's engine flags, need no change here);
- anything else is refused: the shim prints the flag and exits 2, so the test that asked for it fails.

The shim never answers a request itself: it only execs one of the two servers.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks.llama_server_suite.models import local_model

__all__ = ["ACCEPTED", "RENAMED", "ShimError", "llama_server_argv", "turnstile_argv"]

EXIT_REFUSED = 2

RENAMED: dict[str, str] = {
    "--ctx-size": "--ctx",
    "-c": "--ctx",
    "--batch-size": "--batch",
    "-b": "--batch",
    "--ubatch-size": "--ubatch",
    "-ub": "--ubatch",
    "-a": "--alias",
    "--verbose": "-v",
    "-t": "--threads",
}

# flag -> (takes a value, why dropping it changes nothing the suite compares)
ACCEPTED: dict[str, tuple[bool, str]] = {
    "--offline": (False, "nothing is downloaded anyway: models come from the substitution table"),
    "--parallel": (True, "turnstile runs every conversation on one slot, queued; replies are the same"),
    "-np": (True, "as --parallel"),
    "--cont-batching": (False, "batching across slots: one slot here"),
    "--kv-unified": (False, "a KV layout across slots: one slot here"),
    "--no-ui": (False, "turnstile serves no web UI on the API port"),
    "--jinja": (False, "turnstile always renders the model's Jinja template"),
    "--no-jinja": (False, "llama-server then picks its built-in template from the model's (chatml for SmolLM2)"),
    "--no-cache-idle-slots": (False, "idle-slot caching: one slot here"),
    "--backend-sampling": (
        False,
        "sampling on the compute device; turnstile samples on the CPU, as llama-server without it",
    ),
    "--backend_sampling": (False, "as --backend-sampling (llama.cpp's parser takes either spelling; the suite's)"),
    "-bs": (False, "as --backend-sampling"),
}

_VALUE_FLAGS_LLAMA = frozenset({"--hf-repo", "-hf", "-hfr", "--hf-file", "-hff", "--model-url", "-mu", "--model", "-m"})


class ShimError(Exception):
    """A command line the shim cannot map; the message names the flag."""


def _model_args(argv: Sequence[str]) -> tuple[list[str], Path | None, str | None]:
    """argv without its model flags, the local model, and a description of what was asked."""
    rest: list[str] = []
    repo = file = url = model = None
    it = iter(argv)
    for arg in it:
        if arg in _VALUE_FLAGS_LLAMA:
            value = next(it, None)
            if value is None:
                raise ShimError(f"{arg} needs a value")
            if arg in {"--hf-repo", "-hf", "-hfr"}:
                repo = value
            elif arg in {"--hf-file", "-hff"}:
                file = value
            elif arg in {"--model-url", "-mu"}:
                url = value
            else:
                model = value
        else:
            rest.append(arg)
    if model is not None:
        return rest, Path(model), model
    if url is not None:
        return rest, None, url
    asked = f"{repo}" + (f" {file}" if file else "") if repo else None
    return rest, local_model(repo, file), asked


def _local(argv: Sequence[str]) -> tuple[list[str], Path]:
    rest, path, asked = _model_args(argv)
    if path is None:
        raise ShimError(f"no local substitute for the model {asked or '(none given: router mode)'}")
    return rest, path


def llama_server_argv(binary: str, argv: Sequence[str]) -> list[str]:
    rest, path = _local(argv)
    return [binary, "--model", str(path), *rest]


def _serve_options() -> dict[str, bool]:
    """`turnstile serve`'s option strings -> whether each takes a value."""
    from runtime.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    serve = sub.choices["serve"]  # type: ignore[index]
    return {s: a.nargs != 0 for a in serve._actions for s in a.option_strings}


def _value(argv: Sequence[str], *names: str) -> str | None:
    for i, arg in enumerate(argv[:-1]):
        if arg in names:
            return argv[i + 1]
    return None


def _per_slot_ctx(argv: list[str]) -> list[str]:
    """llama-server splits --ctx-size between --parallel slots (unless --kv-unified): each conversation sees
    ctx / parallel tokens. turnstile gives each conversation the whole of its one slot, so the shim passes
    the per-slot size as turnstile's --ctx."""
    ctx, parallel = _value(argv, "--ctx-size", "-c"), _value(argv, "--parallel", "-np")
    if ctx is None or parallel is None or "--kv-unified" in argv or int(parallel) <= 1:
        return argv
    out = list(argv)
    i = next(i for i, a in enumerate(out) if a in {"--ctx-size", "-c"})
    out[i + 1] = str(int(ctx) // int(parallel))
    return out


def turnstile_argv(python: str, argv: Sequence[str]) -> list[str]:
    rest, path = _local(argv)
    rest = _per_slot_ctx(rest)
    known = _serve_options()
    out = ["--model", str(path)]
    if _value(rest, "--cors-origins") is None:  # llama-server's default: any origin, with credentials
        out += ["--cors-origins", "*"]
    if "--metrics" not in rest:  # llama-server's default: no /metrics (turnstile's: on)
        out.append("--no-metrics")
    it = iter(rest)
    for arg in it:
        flag, eq, inline = arg.partition("=")
        name = RENAMED.get(flag, flag)
        if flag in ACCEPTED:
            takes_value, _why = ACCEPTED[flag]
            if takes_value and not eq:
                next(it, None)
            continue
        if name not in known:
            raise ShimError(f"turnstile serve has no equivalent of llama-server's {flag}")
        if known[name]:
            value = inline if eq else next(it, None)
            if value is None:
                raise ShimError(f"{flag} needs a value")
            out += [name, value]
        else:
            out.append(name)
    return [python, "-m", "runtime.cli", "serve", *out]


def _threads(argv: list[str]) -> list[str]:
    """`TURNSTILE_SUITE_THREADS=N`: both servers get `--threads N` unless the test gives its own (so a shared
    machine runs the suite at one thread, each system alike)."""
    n = os.environ.get("TURNSTILE_SUITE_THREADS")
    if not n or any(a.partition("=")[0] in {"--threads", "-t"} for a in argv):
        return argv
    return [*argv, "--threads", n]


def main(argv: Sequence[str]) -> int:
    if not argv or argv[0] not in {"llama-server", "turnstile"}:
        sys.stderr.write("usage: python -m benchmarks.llama_server_suite.shim llama-server|turnstile ARGS...\n")
        return EXIT_REFUSED
    target, args = argv[0], _threads(list(argv[1:]))
    try:
        if target == "llama-server":
            binary = os.environ.get("TURNSTILE_LLAMA_SERVER")
            if not binary:
                raise ShimError("TURNSTILE_LLAMA_SERVER is not set")
            cmd = llama_server_argv(binary, args)
        else:
            cmd = turnstile_argv(sys.executable, args)
    except ShimError as e:
        sys.stderr.write(f"llama-server shim ({target}): refused: {e}\n")
        return EXIT_REFUSED
    sys.stderr.write(f"llama-server shim ({target}): {' '.join(cmd)}\n")
    sys.stderr.flush()
    os.execv(cmd[0], cmd)  # the suite's terminate() then reaches the server itself


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
