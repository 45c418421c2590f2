"""The official `anthropic` client talking to `turnstile serve`'s Messages API: a streamed answer, then a
tool round trip (the model calls `get_weather`, the program runs it and sends back a `tool_result`).

    turnstile serve &            # http://127.0.0.1:8080, SmolLM2-135M by default
    python examples/anthropic_client.py [--base-url http://127.0.0.1:8080] [--max-tokens 64]

The key is TURNSTILE_API_KEY (sent as `x-api-key`, as the client does). `temperature` is not a keyword of
recent `anthropic` clients: it goes in `extra_body`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from typing import Any

from anthropic import AsyncAnthropic

WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def get_weather(city: str) -> str:
    return json.dumps({"city": city, "sky": "sunny", "celsius": 21})


async def run(args: argparse.Namespace) -> None:
    client = AsyncAnthropic(base_url=args.base_url, api_key=os.environ.get("TURNSTILE_API_KEY", "none"))
    greedy: Any = {"extra_body": {"temperature": 0.0}}

    print("streamed: ", end="", flush=True)
    ask = [{"role": "user", "content": "Name three colours."}]
    async with client.messages.stream(model="turnstile", max_tokens=args.max_tokens, messages=ask, **greedy) as s:
        async for text in s.text_stream:
            print(text, end="", flush=True)
    print()

    history: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    tools: Any = [WEATHER]
    choice: Any = {"type": "any"}  # the first reply must call a tool; then the model decides
    for _ in range(3):
        m = await client.messages.create(
            model="turnstile",
            max_tokens=args.max_tokens * 4,
            system="Use the tools you are given.",
            messages=history,
            tools=tools,
            tool_choice=choice,
            **greedy,
        )
        u = m.usage
        print(f"[{u.input_tokens} new prompt tokens, {u.cache_read_input_tokens} from the cache] ", end="")
        calls = [b for b in m.content if b.type == "tool_use"]
        if m.stop_reason != "tool_use":
            print("answer: " + "".join(b.text for b in m.content if b.type == "text"))
            break
        print("calls: " + ", ".join(f"{c.name}({json.dumps(c.input)})" for c in calls))
        history.append({"role": "assistant", "content": m.content})
        results = [{"type": "tool_result", "tool_use_id": c.id, "content": get_weather(**c.input)} for c in calls]  # type: ignore[arg-type]
        history.append({"role": "user", "content": results})
        choice = {"type": "auto"}
    await client.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:8080")
    ap.add_argument("--max-tokens", type=int, default=64)
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
