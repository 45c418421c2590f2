"""`turnstile serve` as a child process, for tests and benchmarks: started on a free loopback port
(`--port 0`), ready when it prints its "listening on URL" line, stopped with SIGTERM (a drain).

    with ServeProcess("--model", path, "--threads", "1") as srv:
        srv.url            # http://127.0.0.1:PORT
    srv.returncode         # 0 after a clean drain
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from runtime.errors import TurnstileError

__all__ = ["ServeProcess", "ServeProcessError"]

_ROOT = Path(__file__).resolve().parents[2]
_READY = "turnstile serve: listening on "


class ServeProcessError(TurnstileError, RuntimeError):
    """The server exited before it was ready (its output is in the message)."""


class ServeProcess:
    """One `python -m runtime.cli serve --port 0 ARGS...` process."""

    def __init__(self, *args: str | os.PathLike[str], env: dict[str, str] | None = None) -> None:
        self.args = [sys.executable, "-m", "runtime.cli", "serve", "--port", "0", *map(str, args)]
        self.env = {**os.environ, "PYTHONPATH": str(_ROOT), **(env or {})}
        self.url = ""
        self.returncode: int | None = None
        self._proc: subprocess.Popen[str] | None = None
        self._err: IO[Any] | None = None

    def __enter__(self) -> ServeProcess:
        self.start()
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> str:
        """Start the server and block until it is ready; its URL."""
        self._err = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - kept for stderr()
        self._proc = subprocess.Popen(
            self.args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._err, text=True, env=self.env
        )
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            if line.startswith(_READY):
                self.url = line[len(_READY) :].split()[0]
                return self.url
        self.stop()
        raise ServeProcessError(f"turnstile serve exited before it was ready:\n{self.stderr()}")

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def terminate(self) -> None:
        """SIGTERM: the server drains (running requests finish, queued ones get 503) and exits."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float = 120.0) -> int:
        assert self._proc is not None
        self.returncode = self._proc.wait(timeout=timeout)
        return self.returncode

    def stderr(self) -> str:
        if self._err is None:
            return ""
        self._err.flush()
        self._err.seek(0)
        return str(self._err.read())

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM and wait (SIGKILL after `timeout`); idempotent."""
        proc = self._proc
        if proc is not None:
            self.terminate()
            try:
                self.returncode = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                self.returncode = proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        self._proc = None  # its stderr file stays readable (closed with this object)
