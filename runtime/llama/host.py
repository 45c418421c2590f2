"""Facts about the host and the model file: thread count and a cheap model fingerprint."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def physical_cores() -> int:
    """Physical cores (llama-server's default thread count); logical CPUs where that is unknown."""
    try:
        pairs: set[tuple[str, str]] = set()
        phys = core = ""
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "physical id":
                    phys = value.strip()
                elif key == "core id":
                    core = value.strip()
                    pairs.add((phys, core))
        if pairs:
            return max(1, min(len(pairs), os.cpu_count() or 1))
    except OSError:
        pass
    return max(1, os.cpu_count() or 1)


def fingerprint_file(path: Path) -> str:
    """A cheap model fingerprint: size plus a hash of the first and last MiB (the GGUF header and tail)."""
    size = path.stat().st_size
    h = hashlib.blake2b(digest_size=16)
    h.update(str(size).encode())
    with path.open("rb") as f:
        h.update(f.read(1 << 20))
        if size > 2 << 20:
            f.seek(-(1 << 20), os.SEEK_END)
            h.update(f.read())
    return h.hexdigest()
