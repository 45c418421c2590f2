"""A conversation through the Responses API with the `openai` client: each turn sends only its new
input and names the previous response (`previous_response_id`); turnstile keeps the history and its KV
state, so `cached_tokens` covers the whole earlier conversation. The last turn branches from the first.

    turnstile serve --data-dir ./state &
    python examples/responses_chain.py [--base-url http://127.0.0.1:8080/v1]
"""

from __future__ import annotations

import argparse
import os

from openai import OpenAI

QUESTIONS = ["Name a colour.", "Why that one?", "Name a fruit of that colour."]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()
    client = OpenAI(base_url=args.base_url, api_key=os.environ.get("TURNSTILE_API_KEY", "none"))
    gen = {"model": "turnstile", "temperature": 0.0, "max_output_tokens": args.max_tokens}
    first = previous = None
    for q in QUESTIONS:
        r = client.responses.create(input=q, previous_response_id=previous, **gen)  # type: ignore[arg-type]
        first = first or r
        previous = r.id
        u = r.usage
        cached = u.input_tokens_details.cached_tokens if u else 0
        print(f"user: {q}\nmodel: {r.output_text}\n[{u.input_tokens if u else 0} prompt tokens, {cached} cached]")
    assert first is not None
    branch = client.responses.create(input="Name an animal instead.", previous_response_id=first.id, **gen)  # type: ignore[arg-type]
    print(f"branch from the first turn: {branch.output_text}")


if __name__ == "__main__":
    main()
