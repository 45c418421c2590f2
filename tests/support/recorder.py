"""A recording reverse proxy for tests and benchmarks: every POST body a client sends is written to a directory
(`0001-v1-responses.json`, …) and forwarded to the upstream server; responses (streams included) are passed
back as they come. For recording what real clients (Claude Code, Codex, OpenCode) send to `turnstile serve`.

    with Recorder(upstream_url, record_dir) as rec:
        rec.url   # point the client here
"""

from __future__ import annotations

import itertools
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx2 as httpx

__all__ = ["Recorder"]

_HOP = {"host", "content-length", "connection", "transfer-encoding", "accept-encoding"}


class Recorder:
    """A threaded HTTP proxy on a free loopback port that records request bodies into `directory`."""

    def __init__(self, upstream: str, directory: Path) -> None:
        self.upstream = upstream.rstrip("/")
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._count = itertools.count(1)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, name="recorder", daemon=True)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def bodies(self) -> list[Path]:
        """The recorded bodies, in the order they came."""
        return sorted(self.directory.glob("*.json"))

    def __enter__(self) -> Recorder:
        self._thread.start()
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _record(self, path: str, body: bytes) -> None:
        with self._lock:
            n = next(self._count)
        name = path.split("?")[0].strip("/").replace("/", "-") or "root"
        (self.directory / f"{n:04d}-{name}.json").write_bytes(body)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        rec = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                return

            def _forward(self, method: str) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                if method == "POST":
                    rec._record(self.path, body)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                with (
                    httpx.Client(timeout=None) as client,
                    client.stream(method, rec.upstream + self.path, content=body, headers=headers) as r,
                ):
                    self.send_response(r.status_code)
                    for k, v in r.headers.items():
                        if k.lower() not in _HOP:
                            self.send_header(k, v)
                    self.send_header("transfer-encoding", "chunked")
                    self.send_header("connection", "close")
                    self.end_headers()
                    for chunk in r.iter_raw():
                        if chunk:
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                            self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                self.close_connection = True

            def do_POST(self) -> None:
                self._forward("POST")

            def do_GET(self) -> None:
                self._forward("GET")

        return Handler
