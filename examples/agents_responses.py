"""An OpenAI Agents SDK agent with a function tool over its default model, the Responses API, pointed at
`turnstile serve` (no switch to chat completions). The second run continues the first by its
`previous_response_id`: only the new question travels, and the conversation's earlier prompt is served
from turnstile's cache. Needs the `agents` extra; tracing is off (traces would go to OpenAI's servers).

    turnstile serve &
    python examples/agents_responses.py [--base-url http://127.0.0.1:8080/v1] [--city Paris]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
from typing import Any

from agents import Agent, AgentHooks, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

CALLS: list[str] = []


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    CALLS.append(city)
    return f"It is sunny in {city}."


class AnswerAfterTool(AgentHooks[Any]):
    """Once the tool has answered, the model answers in text (a tiny model would call the tool again)."""

    async def on_tool_end(self, context: Any, agent: Agent[Any], tool: Any, result: Any) -> None:
        agent.model_settings = dataclasses.replace(agent.model_settings, tool_choice="none")


async def run(args: argparse.Namespace) -> None:
    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=args.base_url, api_key=os.environ.get("TURNSTILE_API_KEY", "none"))
    model = OpenAIResponsesModel(model="turnstile", openai_client=client)
    settings = ModelSettings(temperature=0.0, max_tokens=args.max_tokens, tool_choice="required")
    agent = Agent(name="weather", instructions="Answer in one short sentence.", model=model, tools=[get_weather],
                  model_settings=settings, hooks=AnswerAfterTool(), reset_tool_choice=False)  # fmt: skip
    result = await Runner.run(agent, f"What is the weather in {args.city}?", max_turns=4)
    print(f"tool calls: {CALLS}")
    print(f"agent: {result.final_output}")
    follow = await Runner.run(agent, "Thanks. And tomorrow?", previous_response_id=result.last_response_id, max_turns=4)
    print(f"agent: {follow.final_output}")
    usage = follow.context_wrapper.usage
    print(f"[follow-up: {usage.input_tokens} prompt tokens, {usage.input_tokens_details.cached_tokens} cached]")
    await client.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    ap.add_argument("--city", default="Paris")
    ap.add_argument("--max-tokens", type=int, default=160)
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
