"""`Runtime.run`: the agent loop. Chat with tools; while the model calls them, call the Python functions
(async ones awaited on the event loop, sync ones in a worker thread, never the slot's) and send the
results back; return the final reply with the steps taken.

A function that raises returns its error text to the model as the tool result. A model that repeats a
call it already has the result of (same tool, same arguments) is not given the result again: that reply is
regenerated under the `answer` choice (the tools still described, the reply constrained to an answer), so the
model answers with what it has (small models loop otherwise).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Protocol, Unpack

import anyio.to_thread
import msgspec

from runtime.errors import InvalidRequest, MaxStepsExceeded
from runtime.log import get_logger
from runtime.loop import validate as v
from runtime.loop.options import SamplingOptions, ToolChoiceArg, ToolsArg, TurnOptions, check_sampling_options
from runtime.reply import Reply, Step
from runtime.tools import Tool, ToolCall, ToolChoice, as_tools, result_text

log = get_logger(__name__)


class Chats(Protocol):
    """What the agent loop needs of the Runtime: something that chats (and regenerates a reply)."""

    async def chat(
        self,
        session_id: str,
        message: str | None = None,
        *,
        tool_results: Mapping[str, Any] | None = None,
        **options: Unpack[TurnOptions],
    ) -> Reply: ...

    async def regenerate(self, session_id: str, **options: Unpack[TurnOptions]) -> Reply: ...


async def call_tool(tool: Tool, call: ToolCall) -> Step:
    """Run one call; its result (or its error) as the text that goes back to the model."""
    fn = tool.function
    if fn is None:
        raise InvalidRequest(f"tool {tool.name!r} has no Python function to call (give functions to run)")
    try:
        kwargs = tool.convert_arguments(call.arguments)
        if tool.is_async:
            value = await fn(**kwargs)
        else:
            value = await anyio.to_thread.run_sync(functools.partial(fn, **kwargs))
    except Exception as e:  # the model sees the error and may try again
        log.info("agent.tool_failed", tool=tool.name, error=type(e).__name__)
        return Step(call, f"error: {type(e).__name__}: {e}", error=True)
    return Step(call, result_text(value))


async def run_agent(
    rt: Chats,
    session_id: str,
    message: str,
    tools: ToolsArg,
    tool_choice: ToolChoiceArg,
    max_steps: int,
    timeout: float | None,
    sampling: SamplingOptions,
) -> Reply:
    v.check_count(max_steps, "max_steps")
    check_sampling_options(sampling)  # only sampling settings here: the loop sets the tools itself
    checked = as_tools(tools)
    by_name = {t.name: t for t in checked}
    steps: list[Step] = []
    done: dict[tuple[str, bytes], str] = {}  # (tool, arguments) -> the result the model already has
    reply = await rt.chat(session_id, message, tools=checked, tool_choice=tool_choice, timeout=timeout, **sampling)
    while reply.tool_calls:
        keys = [(c.name, msgspec.json.encode(c.arguments, order="sorted")) for c in reply.tool_calls]
        if all(k in done for k in keys):  # nothing new asked: answer with what you have
            log.info("agent.repeated_call", session_id=session_id, tool=reply.tool_calls[0].name)
            reply = await rt.regenerate(
                session_id, tools=checked, tool_choice=ToolChoice("answer"), timeout=timeout, **sampling
            )
            break
        if len(steps) + len(reply.tool_calls) > max_steps:
            raise MaxStepsExceeded(max_steps, tuple(steps), reply)
        results: dict[str, str] = {}
        for call, key in zip(reply.tool_calls, keys, strict=True):
            step = await call_tool(by_name[call.name], call)
            steps.append(step)
            results[call.id] = done[key] = step.result
        reply = await rt.chat(
            session_id, tool_results=results, tools=checked, tool_choice="auto", timeout=timeout, **sampling
        )
    return msgspec.structs.replace(reply, steps=tuple(steps))
