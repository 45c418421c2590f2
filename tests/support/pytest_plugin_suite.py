"""A sample suite of 20 tests in 4 files that uses the `turnstile` fixture (for tests/testing/test_pytest_plugin*.py):
pytest-asyncio with function- and module-scoped loops, anyio's plugin on asyncio and on trio.

Every test talks (chat, then stream) in a session named "s" (the same id in every test: namespaces keep them
apart), checks that its session holds exactly its own messages and sees no other test's session, writes its replies to
the file given by --replies (one line per reply, sorted by the caller) so two runs can be compared. One test
per file cancels a call as it is made and checks its session is left without the turn.
"""

from __future__ import annotations

from pathlib import Path

CONFTEST = """
import json
import pytest


def pytest_addoption(parser):
    parser.addoption("--replies", default=None)


@pytest.fixture
def keep(request):
    path = request.config.getoption("--replies")

    def write(text):
        if path:
            with open(path, "a", encoding="utf-8") as f:
                f.write(json.dumps([request.node.nodeid, text]) + "\\n")

    return write
"""

BODY = """

async def _talk(turnstile, keep, n):
    first = await turnstile.chat("s", f"Question {n}: what is {n} plus {n}?", max_tokens=4)
    pieces = [piece async for piece in turnstile.stream("s", f"And {n} times {n}?", max_tokens=4)]
    second = pieces[-1]
    assert second.session_id == "s" and "".join(pieces[:-1]) == second.text
    keep(first.text)
    keep(second.text)
    session = await turnstile.get_session("s")
    assert session.id == "s"
    assert [m.content for m in session.messages] == [
        f"Question {n}: what is {n} plus {n}?", first.text, f"And {n} times {n}?", second.text
    ]
    assert await turnstile.list_sessions() == ["s"]


async def _cancel(turnstile, keep):
    import anyio

    with anyio.CancelScope() as scope:
        scope.cancel()  # the call is made, then its caller is cancelled: the request is withdrawn
        await turnstile.chat("s", "Tell me a long story.", max_tokens=1500, ignore_eos=True)
    assert scope.cancelled_caught
    reply = await turnstile.chat("s", "Hello?", max_tokens=4)
    keep(reply.text)
    session = await turnstile.get_session("s")
    assert [m.content for m in session.messages] == ["Hello?", reply.text]
"""

HEADERS = {
    "test_asyncio_function.py": ("import pytest\n", "@pytest.mark.asyncio\n"),
    "test_asyncio_module.py": ("import pytest\n", '@pytest.mark.asyncio(loop_scope="module")\n'),
    "test_anyio_asyncio.py": (
        'import pytest\n\n\n@pytest.fixture\ndef anyio_backend():\n    return "asyncio"\n',
        "@pytest.mark.anyio\n",
    ),
    "test_anyio_trio.py": (
        'import pytest\n\n\n@pytest.fixture\ndef anyio_backend():\n    return "trio"\n',
        "@pytest.mark.anyio\n",
    ),
}


def suite_file(name: str, offset: int, changed: int | None = None) -> str:
    """One file of the suite: four talking tests and one cancelling test; `changed` alters one test's prompt."""
    header, mark = HEADERS[name]
    text = header + BODY
    for i in range(4):
        n = offset + i
        arg = f"{n} + 1000" if n == changed else str(n)
        text += f"\n\n{mark}async def test_talk_{i}(turnstile, keep):\n    await _talk(turnstile, keep, {arg})\n"
    text += f"\n\n{mark}async def test_cancel(turnstile, keep):\n    await _cancel(turnstile, keep)\n"
    return text


def write_suite(root: Path, changed: int | None = None) -> list[str]:
    """Write the suite's four files (and its conftest and ini) under root; returns the file names."""
    (root / "conftest.py").write_text(CONFTEST)
    (root / "pytest.ini").write_text("[pytest]\nasyncio_mode = strict\nasyncio_default_fixture_loop_scope = function\n")
    names = list(HEADERS)
    for k, name in enumerate(names):
        (root / name).write_text(suite_file(name, 10 * k, changed))
    return names
