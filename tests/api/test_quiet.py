"""A library is quiet: nothing on stdout or stderr unless the app asks; importing the cache rules does not
load llama.cpp."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = """
import anyio, sys
from runtime import Runtime{extra_import}
async def main():
{setup}    async with Runtime.open(sys.argv[1], n_ctx=512, n_threads=1) as rt:
        print("reply:", len((await rt.chat("s1", "hello", max_tokens=4, temperature=0.0)).text) >= 0)
anyio.run(main)
"""


def run_script(model: Path, *, configure: bool) -> subprocess.CompletedProcess[str]:
    code = SCRIPT.format(
        extra_import=", configure_logging" if configure else "",
        setup='    configure_logging("info")\n' if configure else "",
    )
    return subprocess.run(
        [sys.executable, "-c", code, str(model)], capture_output=True, text=True, timeout=300, check=False
    )


def test_a_script_with_no_logging_setup_prints_only_its_own_output(tiny_llama: Path) -> None:
    done = run_script(tiny_llama, configure=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "reply: True\n"
    assert done.stderr == ""


def test_configure_logging_shows_events_with_ids(tiny_llama: Path) -> None:
    done = run_script(tiny_llama, configure=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "reply: True\n"
    lines = done.stderr.splitlines()
    finished = [line for line in lines if " request.done " in line]
    assert len(finished) == 1
    assert "session_id=s1" in finished[0] and "request_id=1" in finished[0]
    assert any(" request.queued " in line for line in lines)
    assert not any(" cache.save " in line for line in lines)  # debug events stay below "info"


def test_importing_the_cache_rules_does_not_load_llama_cpp() -> None:
    code = (
        "import sys, caches.prompt_cache, caches.tiered, caches.disk.tier, sessions; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('llama_cpp', 'runtime')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    # the caches use the project's leaves (one home for errors and logging), nothing else of the runtime
    assert done.stdout == "['runtime', 'runtime.errors', 'runtime.log']\n"
