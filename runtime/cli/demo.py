"""`turnstile demo`: a round table of agents, each its own session, taking turns on one model.

Each agent's session holds only its own persona (system prompt), the short user messages the table sends
it (the topic and what the others said since it last spoke) and its own replies. So when an agent speaks
again its previous prompt and reply are a prefix of the new prompt, and the slot reuses that prefix from the
RAM cache (or the disk tier): `prefilled` is just the new user message.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import dataclass
from typing import Any

import anyio

from runtime.api import Runtime
from runtime.cli.term import AGENT_COLOURS, Progress, Style, seconds, table, wants_colour
from runtime.reply import Reply


@dataclass(frozen=True)
class Persona:
    name: str
    system: str
    asks: tuple[str, ...]  # one question per round (cycling), with {topic} in it


PERSONAS = (
    Persona(
        "historian",
        "You are a historian. You explain how the past shaped today.",
        (
            "What can history teach us about {topic}?",
            "What lesson from the past matters most for {topic}?",
            "What did people in the past get wrong about {topic}?",
        ),
    ),
    Persona(
        "engineer",
        "You are an engineer. You explain how things are built and what they cost.",
        (
            "How would you build {topic}, and what would it cost?",
            "What is the hardest problem in {topic}, and how would you solve it?",
            "What would you build first for {topic}?",
        ),
    ),
    Persona(
        "poet",
        "You are a poet. You describe things with vivid images.",
        (
            "Describe {topic} with one vivid image.",
            "What does {topic} feel like?",
            "What colour and sound do you imagine for {topic}?",
        ),
    ),
    Persona(
        "skeptic",
        "You are a skeptic. You point out risks and weak arguments.",
        (
            "What is the biggest risk in {topic}?",
            "Which idea about {topic} is the weakest, and why?",
            "What evidence would change your mind about {topic}?",
        ),
    ),
    Persona(
        "economist",
        "You are an economist. You think about money, jobs and trade.",
        ("Who pays for {topic}, and who gains?", "How will {topic} change people's jobs?"),
    ),
    Persona(
        "doctor",
        "You are a doctor. You care about people's health.",
        ("What does {topic} mean for our health?", "What would you change in {topic} to keep people healthy?"),
    ),
)
DEFAULT_TOPIC = "the future of cities"
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def gist(text: str, max_words: int = 14) -> str:
    """What the other agents hear of a reply: its first sentence, at most `max_words` words."""
    sentence = _SENTENCE_END.split(" ".join(text.split()), maxsplit=1)[0]
    words = sentence.split()
    return sentence if len(words) <= max_words else " ".join(words[:max_words]) + "..."


def turn_message(topic: str, persona: Persona, rnd: int, heard: list[tuple[str, str]]) -> str:
    """One turn's user message: what the others said since this agent last spoke, then its question on the topic.

    Kept short for a 135M model: a gist of each reply, one plain question, "one or two sentences". The gists
    are quoted as `"..." (poet)`: after `The poet said: "..."` a small model tends to answer in the same form.
    A question that changes with the round keeps an agent from repeating its previous answer.
    """
    said = " ".join(f'"{gist(text)}" ({name})' for name, text in heard)
    ask = persona.asks[(rnd - 1) % len(persona.asks)].replace("{topic}", topic)
    return f"{'You heard: ' + said + ' ' if said else ''}{ask} Answer in one or two sentences."


@dataclass(frozen=True)
class Turn:
    round: int
    agent: str
    reply: Reply


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--agents", type=int, default=3, metavar="N", help=f"agents at the table, 1-{len(PERSONAS)} (3)")
    p.add_argument("--rounds", type=int, default=2, metavar="N", help="rounds of the discussion (default 2)")
    p.add_argument("--topic", default=DEFAULT_TOPIC, metavar="TEXT", help=f"what they discuss ({DEFAULT_TOPIC!r})")
    p.add_argument("--policy", choices=("fifo", "affinity", "fair"), default="fifo", help="scheduling policy (fifo)")


def check_arguments(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if not 1 <= args.agents <= len(PERSONAS):
        p.error(f"--agents must be between 1 and {len(PERSONAS)}")
    if args.rounds < 1:
        p.error("--rounds must be at least 1")


async def run(args: argparse.Namespace, open_options: dict[str, Any]) -> int:
    """Run the round table; print the transcript as it is generated, then a table of the turns and a summary."""
    talk = RoundTable(args)
    async with anyio.create_task_group() as tg:
        stop = Progress().start(tg, "loading model…", delay=0.2)
        try:
            async with Runtime.open(policy=args.policy, **open_options) as rt:
                stop()
                await talk.discuss(rt)
        finally:
            stop()
    out = sys.stdout
    out.write("\n" + "\n".join(turn_table(talk.turns)) + "\n\n" + summary(talk.turns, talk.wall) + "\n")
    out.flush()
    return 0


class RoundTable:
    """The agents, their sessions and the turns so far."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.personas = PERSONAS[: args.agents]
        self.out = sys.stdout
        self.style = Style(wants_colour(self.out))
        self.progress = Progress()
        self.turns: list[Turn] = []
        self.wall = 0.0
        self.sampling: dict[str, Any] = {
            "temperature": args.temperature,
            "max_tokens": args.max_tokens,
            "repeat_penalty": 1.1,  # a 135M model loops without it
        }
        if args.seed is not None:
            self.sampling["seed"] = args.seed

    def label(self, i: int) -> str:
        return self.style(self.personas[i].name, "bold", AGENT_COLOURS[i % len(AGENT_COLOURS)])

    async def discuss(self, rt: Runtime) -> None:
        args, personas = self.args, self.personas
        existing = set(await rt.list_sessions())
        for p in personas:
            if f"demo-{p.name}" in existing:  # a previous demo in the same --data-dir
                await rt.delete(f"demo-{p.name}")
            await rt.create_session(f"demo-{p.name}", system=p.system, **self.sampling)
        names = ", ".join(self.label(i) for i in range(len(personas)))
        rounds = f"{args.rounds} round{'s' if args.rounds != 1 else ''}"
        self.out.write(f"Round table on {args.topic}: {names} ({rt.model_name}, {rounds})\n")
        started = time.perf_counter()
        heard: dict[str, list[tuple[str, str]]] = {p.name: [] for p in personas}
        for rnd in range(1, args.rounds + 1):
            self.out.write("\n" + self.style(f"── round {rnd} ──", "dim") + "\n")
            for i, p in enumerate(personas):
                message = turn_message(args.topic, p, rnd, heard[p.name])
                heard[p.name] = []
                reply = await self.speak(rt, i, message)
                self.turns.append(Turn(rnd, p.name, reply))
                for other in personas:
                    if other is not p:
                        heard[other.name].append((p.name, reply.text))
        self.wall = time.perf_counter() - started

    async def speak(self, rt: Runtime, i: int, message: str) -> Reply:
        """Stream one turn on one line: a spinner until the first words, then the words as they come."""
        out, name = self.out, self.personas[i].name
        reply: Reply | None = None
        pending = ""  # whitespace held back: none at the start, one space for a run of it inside, none at the end
        started = False
        async with self.progress.show(f"{name} is thinking…", delay=0.2) as stop:
            async for item in rt.stream(f"demo-{name}", message):
                if isinstance(item, Reply):
                    reply = item
                    continue
                if not isinstance(item, str):  # a tool-call piece: the demo offers no tools
                    continue
                text = pending + item
                body = text.rstrip()
                pending = text[len(body) :]
                if not body:
                    continue
                if not started:
                    stop()
                    out.write(f"{self.label(i)}: ")
                    body = body.lstrip()
                    started = True
                out.write(re.sub(r"\s*\n\s*", " ", body))
                out.flush()
        assert reply is not None
        if not started:
            out.write(f"{self.label(i)}: (nothing)")
        out.write("…\n" if reply.finish_reason == "length" else "\n")
        out.flush()
        return reply


TABLE_HEADERS = ("round", "agent", "prompt", "cached", "prefilled", "generated", "time", "source")


def turn_table(turns: list[Turn]) -> list[str]:
    rows = [
        (
            t.round,
            t.agent,
            t.reply.usage.prompt_tokens,
            t.reply.usage.cached_tokens,
            t.reply.usage.prefilled_tokens,
            t.reply.usage.generated_tokens,
            seconds(t.reply.timings.total),
            t.reply.cache_source,
        )
        for t in turns
    ]
    return table(TABLE_HEADERS, rows, "rlrrrrrl")


def summary(turns: list[Turn], wall: float) -> str:
    """One line: what the prompts cost, what the cache saved (overall and for returning agents), the speed."""
    prompt = sum(t.reply.usage.prompt_tokens for t in turns)
    cached = sum(t.reply.usage.cached_tokens for t in turns)
    prefilled = sum(t.reply.usage.prefilled_tokens for t in turns)
    generated = sum(t.reply.usage.generated_tokens for t in turns)
    later = [t.reply.usage for t in turns if t.round > 1]
    returning = ""
    if later:
        share = 100 * sum(u.cached_tokens for u in later) / max(1, sum(u.prompt_tokens for u in later))
        returning = f", {share:.0f}% for returning agents"
    return (
        f"total: {len(turns)} turns · {prompt} prompt tokens, {cached} cached ({_pct(cached, prompt)}{returning}), "
        f"{prefilled} prefilled · {generated} generated · wall {wall:.1f}s · {generated / max(wall, 1e-9):.1f} tokens/s"
    )


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "0%"
