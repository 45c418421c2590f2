"""A round table: a few agents, each its own session, take turns on one model and stream their words.

    python examples/round_table.py [--model PATH] [--rounds N] [--max-tokens N] [--topic TEXT]

Each agent's session holds only its persona, the short messages the table sends it and its own replies,
so when it speaks again its previous prompt comes back from the prompt cache: only the new message is
prefilled. (`turnstile demo` is the full version of this, with colours, progress and a table.)
"""

import argparse

import anyio

from runtime import Reply, Runtime, configure_logging

configure_logging("warning")  # turnstile's events: warnings only

AGENTS = {
    "historian": ("You are a historian. You explain how the past shaped today.", "What can history teach us about"),
    "engineer": ("You are an engineer. You explain how things are built.", "How would you build"),
    "poet": ("You are a poet. You describe things with vivid images.", "Give one vivid image of"),
}


def gist(text: str) -> str:
    words = " ".join(text.split()).split(". ")[0].split()
    return " ".join(words[:14]) + ("..." if len(words) > 14 else "")


def usage(reply: Reply) -> str:
    u = reply.usage
    return (
        f"[{u.prompt_tokens} prompt = {u.cached_tokens} cached ({reply.cache_source}) + {u.prefilled_tokens} prefilled]"
    )


async def main(args: argparse.Namespace) -> None:
    async with Runtime.open(args.model, n_threads=args.threads) as rt:
        for name, (system, _) in AGENTS.items():
            await rt.create_session(name, system=system, max_tokens=args.max_tokens, temperature=args.temperature)
        heard: dict[str, list[str]] = {name: [] for name in AGENTS}
        for rnd in range(1, args.rounds + 1):
            print(f"-- round {rnd} --")
            for name, (_, ask) in AGENTS.items():
                said = f"You heard: {' '.join(heard[name])} " if heard[name] else ""
                message = f"{said}{ask} {args.topic}? Answer in one or two sentences."
                heard[name] = []
                print(f"{name}: ", end="", flush=True)
                async for item in rt.stream(name, message):
                    if isinstance(item, Reply):
                        print(f"\n   {usage(item)}")
                        for other in AGENTS:
                            if other != name:
                                heard[other].append(f'"{gist(item.text)}" ({name})')
                    else:
                        print(item.replace("\n", " "), end="", flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="a GGUF model (default: SmolLM2-135M-Instruct)")
    p.add_argument("--topic", default="the future of cities")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--threads", type=int, default=None)
    anyio.run(main, p.parse_args())
