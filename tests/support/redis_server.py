"""A real `redis-server` on 127.0.0.1 for tests: started in a tmp dir on a free port, stopped after.

Test modules wrap `running_redis` in a fixture; without the binary the tests that need it are
skipped with the reason (CI installs Debian's `redis-server`). Readiness is the server's own
"Ready to accept connections" log line, read from its stdout: no sleeps, no polling.
"""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

BINARY = "redis-server"
_READY = b"Ready to accept connections"
_START_TIMEOUT = 30.0


class RedisServer:
    """One running redis-server process and how to reach it."""

    def __init__(self, process: subprocess.Popen[bytes], port: int, directory: Path) -> None:
        self.process = process
        self.port = port
        self.directory = directory
        self.url = f"redis://127.0.0.1:{port}/0"
        # Keep reading the log so the server never blocks on a full pipe.
        self._drain = threading.Thread(target=self._read_log, daemon=True)
        self._drain.start()

    def _read_log(self) -> None:
        assert self.process.stdout is not None
        while os.read(self.process.stdout.fileno(), 65536):
            pass

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL if it lingers) and wait for it."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._drain.join()
        if self.process.stdout is not None:
            self.process.stdout.close()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(process: subprocess.Popen[bytes]) -> tuple[bool, bytes]:
    """Read the server's log until it is ready (True) or exits (False); the log so far."""
    assert process.stdout is not None
    log = b""
    deadline = time.monotonic() + _START_TIMEOUT
    with selectors.DefaultSelector() as sel:
        sel.register(process.stdout, selectors.EVENT_READ)
        while _READY not in log:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(timeout=left):
                return False, log + b"\n(no ready line in time)"
            chunk = os.read(process.stdout.fileno(), 65536)
            if not chunk:
                return False, log
            log += chunk
    return True, log


def start_redis(directory: Path, *extra: str) -> RedisServer:
    """Start redis-server in `directory` (no persistence) on a free loopback port; `pytest.skip` without it."""
    binary = shutil.which(BINARY)
    if binary is None:
        pytest.skip(f"{BINARY} is not installed (Debian: apt-get install redis-server)")
    directory.mkdir(parents=True, exist_ok=True)
    log = b""
    for _ in range(5):  # another process may take the free port before the server binds it
        port = free_port()
        args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        args += ["--dir", str(directory), "--daemonize", "no", "--logfile", "", *extra]
        process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=directory)
        ready, log = _wait_ready(process)
        if ready:
            return RedisServer(process, port, directory)
        process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()
    raise RuntimeError(f"redis-server did not start: {log.decode(errors='replace')[-2000:]}")


@contextmanager
def running_redis(directory: Path, *extra: str) -> Iterator[RedisServer]:
    """A redis-server for the duration of the block."""
    server = start_redis(directory, *extra)
    try:
        yield server
    finally:
        server.stop()
