"""Agents vote with structured replies: each answers with a `Vote` Struct and the app tallies them.

    python examples/structured_vote.py [--model PATH] [--question TEXT]

`response_format=Vote` constrains decoding with a grammar built from the Struct's JSON schema, so every
reply parses: `reply.parsed` is a `Vote`, `reply.text` the JSON it came from.
"""

import argparse
from collections import Counter
from typing import Literal

import anyio
import msgspec

from runtime import Reply, Runtime, configure_logging

configure_logging("warning")

PERSONAS = ["a cautious banker", "a bold explorer", "a tired student", "a cheerful chef", "a strict teacher"]


class Vote(msgspec.Struct):
    choice: Literal["yes", "no"]
    reason: str


async def main(args: argparse.Namespace) -> None:
    votes: list[tuple[str, Reply]] = []
    async with Runtime.open(args.model, n_threads=args.threads) as rt:

        async def vote(i: int, persona: str) -> None:
            await rt.create_session(f"voter-{i}", system=f"You are {persona}. Answer in JSON.")
            reply = await rt.chat(f"voter-{i}", args.question, response_format=Vote, max_tokens=64, temperature=0.0)
            votes.append((persona, reply))

        async with anyio.create_task_group() as tg:
            for i, persona in enumerate(PERSONAS):
                tg.start_soon(vote, i, persona)
    tally: Counter[str] = Counter()
    for persona, reply in votes:
        if isinstance(reply.parsed, Vote):
            tally[reply.parsed.choice] += 1
            print(f"{persona}: {reply.parsed.choice} ({reply.parsed.reason[:60]})")
        else:
            print(f"{persona}: no vote ({reply.finish_reason})")
    print("tally: " + ", ".join(f"{k} {v}" for k, v in sorted(tally.items())))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="a GGUF model (default: SmolLM2-135M-Instruct)")
    p.add_argument("--question", default="Should we go to the beach tomorrow?")
    p.add_argument("--threads", type=int, default=None)
    anyio.run(main, p.parse_args())
