"""Two agents debate a motion and a judge decides: three sessions sharing one model.

    python examples/debate.py [--model PATH] [--rounds N] [--max-tokens N] [--motion TEXT]

Each debater's session holds only its own side of the debate, so when it speaks again its earlier
prompt and reply come back from the prompt cache and only the opponent's latest point is prefilled.
"""

import argparse

import anyio

from runtime import Reply, Runtime, configure_logging

configure_logging("warning")  # turnstile's events: warnings only
ASKS = {
    "for": ("What is the biggest benefit of it?", "Which other benefit did your opponent miss?"),
    "against": ("What is the biggest problem with it?", "Which other problem did your opponent miss?"),
}


def gist(text: str) -> str:
    words = " ".join(text.split()).split(". ")[0].split()
    return " ".join(words[:14]) + ("..." if len(words) > 14 else "")


def show(who: str, reply: Reply) -> None:
    u = reply.usage
    print(f"{who}: {' '.join(reply.text.split())}")
    cached = f"{u.cached_tokens} cached ({reply.cache_source})"
    print(f"   [{u.prompt_tokens} prompt = {cached} + {u.prefilled_tokens} prefilled]")


async def main(args: argparse.Namespace) -> None:
    async with Runtime.open(args.model, n_threads=args.threads) as rt:
        for side in ASKS:
            await rt.create_session(side, system=f"You are a debater. You argue {side} the motion. Be brief.")
        await rt.create_session("judge", system="You are a fair debate judge.")
        gen = {"max_tokens": args.max_tokens, "temperature": args.temperature}
        last = {"for": "", "against": ""}
        print(f"Motion: {args.motion}\n")
        for rnd in range(args.rounds):
            for side, other in (("for", "against"), ("against", "for")):
                heard = f'You heard: "{gist(last[other])}" (your opponent) ' if last[other] else ""
                ask = ASKS[side][min(rnd, 1)]
                reply = await rt.chat(
                    side, f"Motion: {args.motion}. {heard}{ask} Answer in one or two sentences.", **gen
                )
                last[side] = reply.text
                show(f"round {rnd + 1} {side}", reply)
        said = f'"{gist(last["for"])}" (for) "{gist(last["against"])}" (against)'
        verdict = await rt.chat(
            "judge", f"Motion: {args.motion}. {said} Who argued better, for or against? Answer in one sentence.", **gen
        )
        show("judge", verdict)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="a GGUF model (default: SmolLM2-135M-Instruct)")
    p.add_argument("--motion", default="cities should ban cars from their centres")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--threads", type=int, default=None)
    anyio.run(main, p.parse_args())
