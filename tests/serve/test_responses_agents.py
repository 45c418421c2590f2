"""The OpenAI Agents SDK over its default model, the Responses API, against a real `turnstile serve`:
an agent with a function tool (called, its result fed back, an answer), continued by
`previous_response_id`; and examples/responses_chain.py against the same server (examples/agents_responses.py
is this test's agent as a program; it is not run here, its longer answers take minutes on a loaded CPU)."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from agents import (
    Agent,
    AgentHooks,
    ModelSettings,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

from tests.support.process import ServeProcess

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


class AnswerAfterTool(AgentHooks[Any]):
    """Once the tool has answered, the model must answer in text (SmolLM2 would call it again)."""

    async def on_tool_end(self, context: Any, agent: Agent[Any], tool: Any, result: Any) -> None:
        agent.model_settings = dataclasses.replace(agent.model_settings, tool_choice="none")


def example(name: str, url: str) -> str:
    cmd = [sys.executable, str(ROOT / "examples" / name), "--base-url", url + "/v1"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True).stdout


async def test_agent_with_a_tool_over_responses(smollm2_path: Path) -> None:
    set_tracing_disabled(True)
    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        calls.append(city)
        return "sunny"

    with ServeProcess("--model", smollm2_path, "--threads", "2", "--ctx", "2048") as srv:
        client = AsyncOpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
        model = OpenAIResponsesModel(model="turnstile", openai_client=client)
        settings = ModelSettings(temperature=0.0, max_tokens=48, tool_choice="required")
        agent = Agent(
            name="w",
            instructions="Answer briefly.",
            model=model,
            tools=[get_weather],
            model_settings=settings,
            hooks=AnswerAfterTool(),
            reset_tool_choice=False,
        )
        result = await Runner.run(agent, "What is the weather in Paris?", max_turns=4)
        assert len(calls) >= 1 and all(isinstance(c, str) and c for c in calls)
        assert isinstance(result.final_output, str) and result.final_output
        kinds = [item.type for item in result.new_items]
        assert kinds[:2] == ["tool_call_item", "tool_call_output_item"] and kinds[-1] == "message_output_item"
        assert result.last_response_id is not None and result.last_response_id.startswith("resp_")
        follow = await Runner.run(agent, "And tomorrow?", previous_response_id=result.last_response_id, max_turns=4)
        usage = follow.context_wrapper.usage
        assert usage.input_tokens_details.cached_tokens > 0  # the earlier conversation, from the cache
        await client.close()

        chain = example("responses_chain.py", srv.url)
        cached = [int(c) for c in re.findall(r"prompt tokens, (\d+) cached\]", chain)]
        assert len(cached) == 3 and cached[0] < cached[1] < cached[2]
        assert "branch from the first turn: " in chain
