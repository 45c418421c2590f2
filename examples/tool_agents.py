"""Agents with real Python tools, running at once: a calculator and a shared notebook.

    python examples/tool_agents.py [--model PATH] [--max-tokens N]

Each agent gets a task; `rt.run` lets the model call the tools (sync ones in a worker thread, async ones on
the event loop), sends the results back and returns the final answer with the steps taken. The notebook is
shared: what one agent writes, another can read.
"""

import argparse

import anyio

from runtime import Reply, Runtime, configure_logging

configure_logging("warning")

NOTEBOOK: dict[str, str] = {}
TASKS = {
    "calc": "What is 12 times 7? Use the multiply tool.",
    "scribe": "Write the note 'meeting at noon' under the key 'plan'.",
    "reader": "Read the note with the key 'plan'.",
}


def multiply(a: float, b: float) -> float:
    """Multiply two numbers."""
    return a * b


def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


async def write_note(key: str, text: str) -> str:
    """Write a note under a key in the shared notebook."""
    NOTEBOOK[key] = text
    return "saved"


async def read_note(key: str) -> str:
    """Read the note with this key from the shared notebook."""
    return NOTEBOOK.get(key, "no such note")


def show(agent: str, reply: Reply) -> None:
    for step in reply.steps:
        print(f"{agent}: called {step.call.name}({step.call.arguments}) -> {step.result}")
    print(f"{agent}: {' '.join(reply.text.split())[:100]}")


async def main(args: argparse.Namespace) -> None:
    tools = [multiply, add, write_note, read_note]
    async with Runtime.open(args.model, n_threads=args.threads) as rt:

        async def work(agent: str, task: str) -> None:
            reply = await rt.run(agent, task, tools=tools, max_steps=4, max_tokens=args.max_tokens, temperature=0.0)
            show(agent, reply)

        async with anyio.create_task_group() as tg:
            for agent, task in TASKS.items():
                tg.start_soon(work, agent, task)
    print(f"notebook: {NOTEBOOK}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="a GGUF model (default: SmolLM2-135M-Instruct)")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--threads", type=int, default=None)
    anyio.run(main, p.parse_args())
