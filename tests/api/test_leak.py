"""The field's leak bug class (llama.cpp #27148, #27422: another conversation's state restored into a request
under concurrent load; a system prompt leaking between clients): many clients with different system prompts
and near-identical histories, concurrent, on real llama.cpp with a small RAM tier of shared blocks that
spills to the disk tier. Every reply must equal the reply its conversation gets when it runs alone on the
same configuration, token for token; and the states really moved through RAM and disk meanwhile."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from runtime import Runtime

N_CLIENTS = 16
N_TURNS = 3
USERS = ["Hello, who are you?", "Tell me one short fact.", "And one more, please."]  # every client's the same
GREEDY: dict[str, Any] = {"temperature": 0.0, "max_tokens": 6}


def system(i: int) -> str:
    # near-identical: one word differs, in the middle of a shared text
    text = "with short, kind answers about the sea, the stars, the tides, the winds and the old maps. "
    return f"You help the crew of ship number {i} {text * 4}"


def options(tmp: Path | None) -> dict[str, Any]:
    # a RAM tier of about three states (blocks of 16 cells), everything else spills to disk (kept: 64 MiB)
    return {
        "data_dir": tmp,
        "n_ctx": 512,
        "n_threads": 1,
        "n_batch": 64,
        "n_ubatch": 32,
        "cache_ram_mib": 1,
        "disk_limit_mib": 64,
        "shared_blocks": 16,
        "policy": "affinity",
    }


async def converse(rt: Runtime, i: int, stateless: bool) -> list[tuple[str, int]]:
    """One client's turns: (reply text, generated tokens) each. Odd clients resend their history (stateless
    chat completions' way), even ones keep a session (X-Session-Id's way)."""
    out: list[tuple[str, int]] = []
    history: list[dict[str, str]] = [{"role": "system", "content": system(i)}]
    for user in USERS[:N_TURNS]:
        history.append({"role": "user", "content": user})
        if stateless:
            reply = await rt.complete(history, **GREEDY)
        else:
            reply = await rt.complete(history, session_id=f"client-{i}", **GREEDY)
        history.append({"role": "assistant", "content": reply.text})
        out.append((reply.text, reply.usage.generated_tokens))
    return out


async def test_concurrent_clients_get_exactly_their_own_replies(tiny_llama: Path, tmp_path: Path) -> None:
    together: dict[int, list[tuple[str, int]]] = {}
    async with Runtime.open(tiny_llama, **options(tmp_path / "together")) as rt:

        async def client(i: int) -> None:
            together[i] = await converse(rt, i, stateless=i % 2 == 1)

        async with anyio.create_task_group() as tg:
            for i in range(N_CLIENTS):
                tg.start_soon(client, i)
        stats = rt.stats()
    assert stats.disk is not None and stats.disk.puts > 0  # RAM was too small: states went to disk
    assert stats.slot.disk_loads > 0 and stats.slot.ram_loads > 0  # ... and came back from both tiers

    for i in range(N_CLIENTS):
        async with Runtime.open(tiny_llama, **options(tmp_path / f"alone-{i}")) as alone:
            assert await converse(alone, i, stateless=i % 2 == 1) == together[i], f"client {i}"
    texts = {tuple(t for t, _ in together[i]) for i in range(N_CLIENTS)}
    assert len(texts) > 1  # the system prompts do change the replies: a leak would show
