"""The official `openai` client talking to `turnstile serve`: a one-off question, a streamed answer, and a
conversation that resends its whole history every turn (as OpenAI clients do) under an `X-Session-Id`
header, so turnstile queues it per session, stores its transcript, and reuses the cached history.

    turnstile serve &            # http://127.0.0.1:8080, SmolLM2-135M by default
    python examples/openai_client.py [--base-url http://127.0.0.1:8080/v1] [--max-tokens 48]
"""

from __future__ import annotations

import argparse
import asyncio
import os

from openai import AsyncOpenAI

QUESTIONS = ("What is a prime number?", "Give me an example.", "Is 1 prime?")


async def run(args: argparse.Namespace) -> None:
    client = AsyncOpenAI(base_url=args.base_url, api_key=os.environ.get("TURNSTILE_API_KEY", "none"))
    sampling = {"max_tokens": args.max_tokens, "temperature": 0.0}

    r = await client.chat.completions.create(
        model="turnstile", messages=[{"role": "user", "content": "Say hello in French."}], **sampling
    )
    print(f"one-off: {r.choices[0].message.content}")

    print("streamed: ", end="", flush=True)
    stream = await client.chat.completions.create(
        model="turnstile", messages=[{"role": "user", "content": "Name three colours."}], stream=True, **sampling
    )
    async for chunk in stream:
        if chunk.choices:
            print(chunk.choices[0].delta.content or "", end="", flush=True)
    print()

    history = [{"role": "system", "content": "You are a patient maths teacher. Answer briefly."}]
    for question in QUESTIONS:
        history.append({"role": "user", "content": question})
        r = await client.chat.completions.create(
            model="turnstile", messages=history, extra_headers={"X-Session-Id": "openai-example"}, **sampling
        )
        answer = r.choices[0].message.content or ""
        history.append({"role": "assistant", "content": answer})
        u = r.usage
        cached = u.prompt_tokens_details.cached_tokens if u and u.prompt_tokens_details else 0
        print(f"> {question}\n{answer}\n[{u.prompt_tokens if u else 0} prompt tokens, {cached} cached]")
    await client.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    ap.add_argument("--max-tokens", type=int, default=48)
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
