"""Many agents ask at once: one model answers them one at a time, and each reply says how long it queued.

    python examples/concurrent_agents.py [--model PATH] [--agents N] [--max-tokens N] [--policy fifo|affinity]

Wave 1: every agent asks its first question at the same moment (an anyio task group); the runtime queues
them and runs them in turn on its one llama.cpp slot. Wave 2: every agent follows up, and its earlier prompt
and reply come back from the prompt cache ("ram" or "slot"), so only the new message is prefilled.
"""

import argparse

import anyio

from runtime import Reply, Runtime, configure_logging

configure_logging("warning")  # turnstile's events: warnings only

SUBJECTS = ["the moon", "volcanoes", "honey bees", "the ocean", "trains", "clouds", "libraries", "chess"]


def show(wave: int, agent: str, reply: Reply) -> None:
    u, t = reply.usage, reply.timings
    print(
        f"wave {wave} {agent:<8} queued {t.queued:5.2f}s  total {t.total:5.2f}s  cache {reply.cache_source:<5} "
        f"prompt {u.prompt_tokens:3d} = {u.cached_tokens:3d} cached + {u.prefilled_tokens:3d} prefilled  "
        f"| {' '.join(reply.text.split())[:70]}"
    )


async def main(args: argparse.Namespace) -> None:
    agents = [f"agent-{i}" for i in range(args.agents)]
    async with Runtime.open(args.model, n_threads=args.threads, policy=args.policy) as rt:
        for i, agent in enumerate(agents):
            subject = SUBJECTS[i % len(SUBJECTS)]
            await rt.create_session(agent, system=f"You are a friendly expert on {subject}. Answer briefly.")

        async def ask(wave: int, i: int, agent: str) -> None:
            subject = SUBJECTS[i % len(SUBJECTS)]
            question = f"In one sentence, what is {subject}?" if wave == 1 else "Tell me one surprising fact about it."
            reply = await rt.chat(agent, question, max_tokens=args.max_tokens, temperature=0.0)
            show(wave, agent, reply)

        for wave in (1, 2):
            async with anyio.create_task_group() as tg:  # all agents at once
                for i, agent in enumerate(agents):
                    tg.start_soon(ask, wave, i, agent)
        st = rt.stats().slot
        print(
            f"{st.requests} turns: {st.prompt_tokens} prompt tokens, {st.cached_tokens} from the cache, "
            f"{st.prefilled_tokens} prefilled; {st.ram_loads} RAM loads, {st.swaps} swaps"
        )


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="a GGUF model (default: SmolLM2-135M-Instruct)")
    p.add_argument("--agents", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--policy", choices=["fifo", "affinity"], default="fifo")
    anyio.run(main, p.parse_args())
