"""Cassettes: one JSON file per test file, mapping a request's key to the slot's reply, for replay without a model.

A request's key is a hash of the model fingerprint, the rendered prompt (the chat template's text, tools and
template variables included), the sampling settings and the constraints (grammar, reasoning budget). The
reply recorded is the slot's raw output (its text before the reasoning / tool-call parser, the finish reason
and the token counts): replay feeds it to the same parser, so `reply.text`, `reasoning`, `tool_calls` and
`parsed` come out as they did when it was recorded. Each model recorded keeps its chat-template settings
(`ChatTemplate.settings()` and the generation prompt), so replay renders prompts exactly without the GGUF.

Files are stable for review: keys sorted, two-space indent, no timestamps; an entry names the test and the
session that recorded it and keeps the prompt text (for the "nearest recording" message of a miss). Saving
merges with what is on disk under an exclusive lock, so pytest-xdist workers recording the same file lose
nothing. Nothing is unpickled: the file is JSON, checked when read (`InvalidCassette`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from caches.tokens import lcp
from runtime.errors import InvalidCassette

FORMAT = 1


def request_key(fingerprint: str, prompt: str, request: dict[str, Any]) -> str:
    """The key of one request: a hash of the model fingerprint, the prompt text and the request settings."""
    blob = json.dumps({"model": fingerprint, "prompt": prompt, "request": request}, sort_keys=True)
    return hashlib.blake2b(blob.encode(), digest_size=12).hexdigest()


@dataclass
class Cassette:
    """The recordings of one test file (see the module docstring). `dirty`: something was recorded."""

    path: Path
    models: dict[str, dict[str, Any]] = field(default_factory=dict)  # fingerprint -> template settings
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)  # key -> entry
    existed: bool = False
    dirty: bool = False

    @classmethod
    def load(cls, path: Path) -> Cassette:
        """The cassette at `path` (empty if there is none yet); `InvalidCassette` if the file is not one."""
        if not path.is_file():
            return cls(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise InvalidCassette(f"{path}: not a readable cassette ({e})") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise InvalidCassette(f"{path}: not a turnstile cassette of format {FORMAT}")
        models, entries = data.get("models"), data.get("entries")
        if not isinstance(models, dict) or not isinstance(entries, dict):
            raise InvalidCassette(f"{path}: 'models' and 'entries' must be objects")
        for key, entry in entries.items():
            if not isinstance(entry, dict) or not isinstance(entry.get("reply"), dict):
                raise InvalidCassette(f"{path}: entry {key} has no reply")
        return cls(path, models, entries, existed=True)

    def model_for(self, name: str) -> str | None:
        """The fingerprint recorded for a model file name, else the only model recorded, else None (replay
        without the model file: its recordings are found by its name, or by being the only ones)."""
        found = [fp for fp, m in sorted(self.models.items()) if Path(str(m.get("model", ""))).name == name]
        if found:
            return found[0]
        return next(iter(self.models)) if len(self.models) == 1 else None

    def record(self, key: str, entry: dict[str, Any]) -> None:
        self.entries[key] = entry
        self.dirty = True

    def add_model(self, fingerprint: str, settings: dict[str, Any]) -> None:
        if self.models.get(fingerprint) != settings:
            self.models[fingerprint] = settings
            self.dirty = True

    def save(self) -> None:
        """Write what was recorded, merged with the file as it is now (another process may have written it)."""
        if not self.dirty:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock = self.path.with_name(self.path.name + ".lock")
        with lock.open("a") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            try:
                on_disk = Cassette.load(self.path)
            except InvalidCassette:
                on_disk = Cassette(self.path)
            models = {**on_disk.models, **self.models}
            entries = {**on_disk.entries, **self.entries}
            text = json.dumps({"format": FORMAT, "models": models, "entries": entries}, sort_keys=True, indent=2)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(text + "\n", encoding="utf-8")
            os.replace(tmp, self.path)
        with contextlib.suppress(OSError):
            lock.unlink()
        self.dirty = False

    def nearest(self, prompt: str, request: dict[str, Any], test: str = "", session: str = "") -> str:
        """Where `prompt` differs from the nearest recorded prompt (the same test's and session's first, then
        the longest common prefix): the first differing line, with context."""
        if not self.entries:
            return f"the cassette {self.path} holds no recordings (record them with --turnstile-record-mode once)"

        def rank(e: dict[str, Any]) -> tuple[bool, bool, int, str]:
            same = e.get("test") == test
            return same, same and e.get("session") == session, lcp(str(e.get("prompt", "")), prompt), e["key"]

        best = max(({**e, "key": k} for k, e in self.entries.items()), key=rank)
        recorded = str(best.get("prompt", ""))
        if recorded == prompt:
            return (
                f"the prompt was recorded by {best.get('test')} with other settings: recorded "
                f"{json.dumps(best.get('request'), sort_keys=True)}, now {json.dumps(request, sort_keys=True)}"
            )
        return f"nearest recording is {best.get('test')} (session {best.get('session')!r}):\n" + _diff(recorded, prompt)


def _diff(recorded: str, prompt: str, context: int = 2) -> str:
    """The first line where the two prompts differ, with `context` lines before it."""
    old, new = recorded.split("\n"), prompt.split("\n")
    i = 0
    while i < min(len(old), len(new)) and old[i] == new[i]:
        i += 1
    lines = [f"  first difference at prompt line {i + 1}:"]
    lines += [f"    {line!r}" for line in new[max(0, i - context) : i]]
    lines.append(f"  - recorded: {old[i]!r}" if i < len(old) else "  - recorded: (the prompt ends here)")
    lines.append(f"  + now:      {new[i]!r}" if i < len(new) else "  + now:      (the prompt ends here)")
    return "\n".join(lines)
