"""A small llama-server harness (stdlib only): start it on a loopback port, chat, stop it.

    with LlamaServer(binary, model, n_ctx=4096, threads=2, cache_ram_mib=8192) as srv:
        reply = srv.chat([{"role": "user", "content": "hi"}], max_tokens=32)
        reply.text, reply.finish_reason, reply.cache_n, reply.prompt_n, reply.predicted_n

The server runs with one slot and the settings that make its answers comparable with turnstile's
(`server_args`): `-np 1 --cache-ram MIB -c N -b 2048 -ub 512 -fa on -t T -tb T --jinja`, the prompt-cache
knobs at their defaults but spelled out (`--slot-prompt-similarity 0.1 --cache-reuse 0
--ctx-checkpoints 32 --checkpoint-min-step 8192`), no context shift, no unified KV, no idle-slot
caching, no memory fitting, no warmup (it clears its memory afterwards, so it changes no numbers; it
only costs start-up time) and no web UI. Every HTTP call has a timeout, and the server is always stopped
(terminate, wait, kill) when the `with` block ends, also on an exception.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from runtime.errors import TurnstileError

__all__ = ["LlamaServer", "LlamaServerError", "ServerReply", "free_port", "server_args"]

HOST = "127.0.0.1"


class LlamaServerError(TurnstileError, RuntimeError):
    """llama-server did not start, answered with an error, or did not answer in time."""


@dataclass(frozen=True)
class ServerReply:
    """One chat turn as llama-server answered it."""

    text: str
    finish_reason: str
    cache_n: int  # timings.cache_n: prompt tokens reused from the slot (or a state loaded into it)
    prompt_n: int  # timings.prompt_n: prompt tokens evaluated
    predicted_n: int  # timings.predicted_n: generated tokens (an end-of-generation token included)
    prompt_ms: float
    predicted_ms: float
    prompt_tokens: int  # usage.prompt_tokens
    completion_tokens: int  # usage.completion_tokens
    cached_tokens: int  # usage.prompt_tokens_details.cached_tokens
    raw: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)


def free_port() -> int:
    """A TCP port on the loopback interface that is free now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def server_args(
    binary: str | os.PathLike[str],
    model: str | os.PathLike[str],
    *,
    port: int,
    n_ctx: int,
    threads: int,
    cache_ram_mib: int,
    n_batch: int = 2048,
    n_ubatch: int = 512,
    seed: int = 0,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The llama-server command line (one slot, settings that matter for comparable numbers)."""
    return [
        str(binary),
        "-m",
        str(model),
        "--host",
        HOST,
        "--port",
        str(port),
        "-np",
        "1",
        "-c",
        str(n_ctx),
        "-b",
        str(n_batch),
        "-ub",
        str(n_ubatch),
        "-fa",
        "on",
        "-t",
        str(threads),
        "-tb",
        str(threads),
        "--jinja",
        "--cache-ram",
        str(cache_ram_mib),
        "--slot-prompt-similarity",
        "0.1",
        "--cache-reuse",
        "0",
        "--ctx-checkpoints",
        "32",
        "--checkpoint-min-step",
        "8192",
        "--no-context-shift",
        "--no-kv-unified",
        "--no-cache-idle-slots",
        "--fit",
        "off",
        "--no-warmup",
        "--no-webui",
        "--seed",
        str(seed),
        *extra_args,
    ]


class LlamaServer:
    """A llama-server process on a free loopback port, for the length of a `with` block."""

    def __init__(
        self,
        binary: str | os.PathLike[str],
        model: str | os.PathLike[str],
        *,
        n_ctx: int,
        threads: int,
        cache_ram_mib: int,
        extra_args: Sequence[str] = (),
        n_batch: int = 2048,
        n_ubatch: int = 512,
        seed: int = 0,
        start_timeout: float = 180.0,
        request_timeout: float = 300.0,
        stop_timeout: float = 10.0,
    ) -> None:
        self.binary = Path(binary)
        self.model = Path(model)
        self.n_ctx = n_ctx
        self.threads = threads
        self.cache_ram_mib = cache_ram_mib
        self.extra_args = tuple(extra_args)
        self.n_batch = n_batch
        self.n_ubatch = n_ubatch
        self.seed = seed
        self.start_timeout = start_timeout
        self.request_timeout = request_timeout
        self.stop_timeout = stop_timeout
        self.port = 0
        self.args: list[str] = []
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None  # the server's stdout + stderr (a temporary file)

    # --- lifetime ---------------------------------------------------------------------------------

    def __enter__(self) -> LlamaServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self) -> None:
        """Start the server and wait until /health says it is ready (three tries if the port was taken)."""
        if not self.binary.is_file():
            raise LlamaServerError(f"no llama-server binary at {self.binary}")
        if not self.model.is_file():
            raise LlamaServerError(f"no model file at {self.model}")
        last = ""
        for _ in range(3):
            self.port = free_port()
            self.args = server_args(
                self.binary,
                self.model,
                port=self.port,
                n_ctx=self.n_ctx,
                threads=self.threads,
                cache_ram_mib=self.cache_ram_mib,
                n_batch=self.n_batch,
                n_ubatch=self.n_ubatch,
                seed=self.seed,
                extra_args=self.extra_args,
            )
            self._log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in stop()
            self._proc = subprocess.Popen(
                self.args, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT
            )
            try:
                if self._wait_ready():
                    return
            except BaseException:
                self.stop()
                raise
            last = self.log_tail()
            self.stop()
            if "bind" not in last.lower() and "address already in use" not in last.lower():
                break
        raise LlamaServerError(f"llama-server did not start:\n{last}")

    def _wait_ready(self) -> bool:
        """True once /health answers 200; False if the process exited; raises on the start timeout."""
        assert self._proc is not None
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2.0) as r:
                    if r.status == 200:
                        return True
            except (urllib.error.URLError, OSError, TimeoutError):
                pass
            time.sleep(0.1)
        raise LlamaServerError(f"llama-server not ready after {self.start_timeout:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        """Terminate the server, wait, kill it after `stop_timeout`; close its log. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=self.stop_timeout)
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, n_bytes: int = 4000) -> str:
        """The end of the server's output (for error messages)."""
        if self._log is None:
            return ""
        try:
            self._log.flush()
            size = self._log.seek(0, os.SEEK_END)
            self._log.seek(max(0, size - n_bytes))
            return bytes(self._log.read()).decode("utf-8", "replace")
        except (OSError, ValueError):
            return ""

    # --- HTTP -------------------------------------------------------------------------------------

    def _request(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        if self._proc is None or self._proc.poll() is not None:
            raise LlamaServerError("llama-server is not running")
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=self.request_timeout) as r:
                return json.loads(r.read().decode("utf-8"))
        except urllib.error.HTTPError as e:
            detail = e.read().decode("utf-8", "replace")
            raise LlamaServerError(f"{method} {path}: HTTP {e.code}: {detail}") from e
        except (urllib.error.URLError, OSError, TimeoutError) as e:
            raise LlamaServerError(f"{method} {path}: {e}\n{self.log_tail()}") from e

    def chat(
        self,
        messages: Sequence[Mapping[str, str]],
        *,
        max_tokens: int,
        temperature: float = 0.0,
        seed: int | None = None,
        **sampling: Any,
    ) -> ServerReply:
        """One chat turn (POST /v1/chat/completions, prompt caching on); `sampling`: extra request fields."""
        body: dict[str, Any] = {
            "messages": [dict(m) for m in messages],
            "max_tokens": max_tokens,
            "temperature": temperature,
            "seed": self.seed if seed is None else seed,
            "cache_prompt": True,
            "stream": False,
            **sampling,
        }
        res = self._request("POST", "/v1/chat/completions", body)
        try:
            choice = res["choices"][0]
            timings = res["timings"]
            usage = res["usage"]
            return ServerReply(
                text=choice["message"].get("content") or "",
                finish_reason=str(choice["finish_reason"]),
                cache_n=int(timings["cache_n"]),
                prompt_n=int(timings["prompt_n"]),
                predicted_n=int(timings["predicted_n"]),
                prompt_ms=float(timings["prompt_ms"]),
                predicted_ms=float(timings["predicted_ms"]),
                prompt_tokens=int(usage["prompt_tokens"]),
                completion_tokens=int(usage["completion_tokens"]),
                cached_tokens=int(usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)),
                raw=res,
            )
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise LlamaServerError(f"unexpected chat reply: {res!r}") from e

    def apply_template(self, messages: Sequence[Mapping[str, str]]) -> str:
        """The prompt text llama-server renders for `messages` (POST /apply-template)."""
        return str(self._request("POST", "/apply-template", {"messages": [dict(m) for m in messages]})["prompt"])

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """llama-server's tokens for `text` (POST /tokenize)."""
        res = self._request(
            "POST", "/tokenize", {"content": text, "add_special": add_special, "parse_special": parse_special}
        )
        return [int(t) for t in res["tokens"]]

    def completion(
        self, prompt: str | Sequence[int], *, max_tokens: int, temperature: float = 0.0, **fields: Any
    ) -> dict[str, Any]:
        """A raw completion (POST /completion) with the generated token ids (`return_tokens`)."""
        body: dict[str, Any] = {
            "prompt": prompt if isinstance(prompt, str) else list(prompt),
            "n_predict": max_tokens,
            "temperature": temperature,
            "seed": self.seed,
            "cache_prompt": True,
            "return_tokens": True,
            "stream": False,
            **fields,
        }
        return dict(self._request("POST", "/completion", body))

    def health(self) -> dict[str, Any]:
        return dict(self._request("GET", "/health"))
