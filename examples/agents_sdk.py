"""Two OpenAI Agents SDK agents (a writer and a critic) on one local model through `turnstile serve`.

Each agent names its own session with an `X-Session-Id` header: its requests are queued one at a time
and its transcript is kept, and when the writer comes back to revise its draft, its earlier prompt is
served from turnstile's cache (see `cached` below). Needs the `agents` extra (`pip install
'llama-turnstile[agents]'`); tracing is turned off, as traces would go to OpenAI's servers.

    turnstile serve &
    python examples/agents_sdk.py [--base-url http://127.0.0.1:8080/v1] [--topic 'tea'] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import os

from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
from openai import AsyncOpenAI


def agent(name: str, instructions: str, model: OpenAIChatCompletionsModel, max_tokens: int) -> Agent:
    settings = ModelSettings(temperature=0.0, max_tokens=max_tokens, extra_headers={"X-Session-Id": f"agents-{name}"})
    return Agent(name=name, instructions=instructions, model=model, model_settings=settings)


async def run(args: argparse.Namespace) -> None:
    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=args.base_url, api_key=os.environ.get("TURNSTILE_API_KEY", "none"))
    model = OpenAIChatCompletionsModel(model="turnstile", openai_client=client)
    writer = agent("writer", "You write one short paragraph.", model, args.max_tokens)
    critic = agent("critic", "You criticise a paragraph in one or two sentences.", model, args.max_tokens)

    draft = await Runner.run(writer, f"Write a short paragraph about {args.topic}.")
    print(f"writer: {draft.final_output}")
    review = await Runner.run(critic, f"Criticise this paragraph: {draft.final_output}")
    print(f"critic: {review.final_output}")
    again = [*draft.to_input_list(), {"role": "user", "content": f"Revise it. The critic said: {review.final_output}"}]
    revised = await Runner.run(writer, again)
    print(f"writer: {revised.final_output}")
    usage = revised.context_wrapper.usage
    print(f"[revision: {usage.input_tokens} prompt tokens, {usage.input_tokens_details.cached_tokens} cached]")
    await client.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    ap.add_argument("--topic", default="tea")
    ap.add_argument("--max-tokens", type=int, default=64)
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
