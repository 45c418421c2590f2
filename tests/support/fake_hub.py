"""A Hugging Face hub on loopback for the download tests: the few routes `huggingface_hub` calls to list a
repository and download a file, in the hub's URL layout, so that the real client runs against it through
`HF_ENDPOINT`.

    GET  /api/models/ORG/REPO/tree/REV      the repository's files (JSON; 404 + X-Error-Code for an unknown repo)
    HEAD /ORG/REPO/resolve/REV/FILE         X-Repo-Commit, ETag, Content-Length
    GET  /ORG/REPO/resolve/REV/FILE         the bytes; honours `Range: bytes=N-` (206)

Every request is recorded (`requests`). `cut_next` makes the next full GET of a file send only that many
bytes of it and drop the connection: the client must resume it with a Range request.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Seen:
    method: str
    path: str
    range: str | None


@dataclass
class FakeHub:
    repos: dict[str, dict[str, bytes]]  # "org/repo" -> {path in repo: bytes}
    url: str = ""
    requests: list[Seen] = field(default_factory=list)
    cut_next: int | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def file_requests(self) -> list[Seen]:
        return [r for r in self.requests if "/resolve/" in r.path]


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # quiet
            pass

        def _error(self, status: int, code: str, message: str, head: bool = False) -> None:
            body = json.dumps({"error": message}).encode()
            self.send_response(status)
            self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def _route(self, head: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            with hub.lock:
                hub.requests.append(Seen(self.command, path, self.headers.get("Range")))
            parts = path.strip("/").split("/")
            if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] == "tree":
                repo = "/".join(parts[2:4])
                if repo not in hub.repos:
                    return self._error(404, "RepoNotFound", "Repository not found", head)
                listing = [
                    {"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                    for name, data in sorted(hub.repos[repo].items())
                ]
                body = json.dumps(listing).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)
                return None
            if len(parts) >= 5 and parts[2] == "resolve":
                repo, name = "/".join(parts[:2]), "/".join(parts[4:])
                if repo not in hub.repos:
                    return self._error(404, "RepoNotFound", "Repository not found", head)
                if name not in hub.repos[repo]:
                    return self._error(404, "EntryNotFound", "Entry not found", head)
                return self._file(hub.repos[repo][name], head)
            return self._error(404, "RepoNotFound", "Not found", head)

        def _file(self, data: bytes, head: bool) -> None:
            start = 0
            want = self.headers.get("Range")
            if want and want.startswith("bytes=") and want.endswith("-"):
                start = int(want[len("bytes=") : -1])
            self.send_response(206 if start else 200)
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(data) - start))
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()
            if head:
                return
            with hub.lock:
                cut, hub.cut_next = (hub.cut_next, None) if not start else (None, hub.cut_next)
            if cut is not None:
                self.wfile.write(data[:cut])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(data[start:])

        def do_GET(self) -> None:
            self._route(head=False)

        def do_HEAD(self) -> None:
            self._route(head=True)

    return Handler


@contextmanager
def running_hub(repos: dict[str, dict[str, bytes]]) -> Iterator[FakeHub]:
    hub = FakeHub(repos)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    server.daemon_threads = True
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
