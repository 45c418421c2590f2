"""Reading a tool case as the Runtime reads a reply: the template's formats as the Runtime works them out, the
reasoning split as runtime/loop/turns.py makes it, then the tool plan's parse (whole) or `parse_partial` after
every piece (streamed), with the checks that streamed readings only ever grow."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runtime.reasoning import ReasoningFormat, Splitter, detect, join, with_template
from runtime.templates import apply_template
from runtime.tools import ToolFormat, ToolPlan, detect_format
from tests.support.tool_cases import Case, tool_defs
from tests.support.vendor import vendored_template

SEED = "tool-case"  # the per-reply seed of call ids the model does not write (the same for whole and streamed)

__all__ = ["Read", "TemplateView", "read_streamed", "read_whole", "stored", "view"]


@dataclass(frozen=True)
class Read:
    """A reply as read: reasoning, content, and the calls as (name, arguments, id)."""

    reasoning: str
    content: str
    calls: tuple[tuple[str, dict[str, Any], str], ...]


class TemplateView:
    """A template as the Runtime sees it: its tool format (`detect_format`, given a renderer, as
    runtime/llama/chat_template.py calls it) and its reasoning format (`detect` + `with_template`, as
    runtime/backend/llama.py works it out)."""

    def __init__(self, template: str) -> None:
        self.template = template
        self.source = vendored_template(template)
        source = self.source

        def render(messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
            return apply_template(source, messages, add_generation_prompt=add_generation_prompt)

        self.tools: ToolFormat = detect_format(source, render, "")
        fmt = detect(source)
        if fmt is not None:
            kwargs = {"enable_thinking": True} if fmt.switch else None

            def bare(messages: list[dict[str, Any]]) -> str:
                return apply_template(source, messages, add_generation_prompt=False, chat_template_kwargs=kwargs)

            fmt = with_template(fmt, bare)
        self.reasoning: ReasoningFormat | None = fmt

    def plan(self, case: Case) -> ToolPlan:
        return ToolPlan.build(self.tools, tool_defs(case.tools), "auto", parallel=case.parallel)

    def variables(self, case: Case) -> dict[str, Any]:
        return {} if case.thinking is None else {"enable_thinking": case.thinking}

    def prompt(self, case: Case, messages: list[dict[str, Any]] | None = None, *, generation: bool = True) -> str:
        """The prompt the Runtime renders for `messages` (default: one user message) with the case's tools."""
        plan = self.plan(case)
        rp = plan.render_plan(messages if messages is not None else [{"role": "user", "content": "Hey there"}])
        kwargs = {**self.variables(case), **rp.kwargs}
        return apply_template(
            self.source, rp.messages, tools=rp.tools, add_generation_prompt=generation, chat_template_kwargs=kwargs
        )

    def splitter(self, case: Case) -> Splitter:
        """The reasoning splitter turns.py makes for the case's prompt."""
        fmt = self.reasoning
        prompt = self.prompt(case)
        inside = fmt is not None and fmt.opens_block(prompt)
        prefix = prompt[prompt.rfind(fmt.start) :] if fmt is not None and inside else ""
        return Splitter(fmt, inside=inside, prefix=prefix)


_VIEWS: dict[str, TemplateView] = {}


def view(template: str) -> TemplateView:
    """The (cached) Runtime view of a vendored template."""
    if template not in _VIEWS:
        _VIEWS[template] = TemplateView(template)
    return _VIEWS[template]


def read_whole(case: Case) -> Read:
    """Split the reasoning off, then parse the answer with the tool plan (ToolCallParseError passes through)."""
    v = view(case.template)
    s = v.splitter(case)
    parts = join(s.feed(case.output) + s.flush())
    reply = v.plan(case).parse(parts.content, seed=SEED)
    calls = tuple((c.name, dict(c.arguments), c.id) for c in reply.tool_calls)
    return Read(parts.reasoning, reply.content, calls)


def read_streamed(case: Case, step: int = 1, check: Callable[[str], None] | None = None) -> Read:
    """Feed the output `step` characters at a time, reading the answer so far with `parse_partial` after each
    piece; every partial reading must extend the one before (content, each call's name, id and arguments
    text), and the message is what the deltas add up to. `check(message)` is called on a violation."""
    v = view(case.template)
    s = v.splitter(case)
    plan = v.plan(case)
    tools = plan.choice.allowed(plan.tools)
    pieces: list[str] = []
    prev_content = ""
    prev: list[tuple[str, str, str]] = []  # (id, name, arguments) per call
    content = ""
    calls: list[list[str]] = []
    fail = check or _raise

    def diff(answer: str) -> None:
        nonlocal prev_content, prev, content
        partial = v.tools.parse_partial(answer, tools, seed=SEED)
        if not partial.content.startswith(prev_content):
            fail(f"content {partial.content!r} does not extend {prev_content!r} at {answer!r}")
        content += partial.content[len(prev_content) :]
        now = [(c.id, c.name, c.arguments) for c in partial.calls]
        if len(now) < len(prev):
            fail(f"{len(prev)} calls became {len(now)} at {answer!r}")
        for i, (cid, name, args) in enumerate(now):
            if i == len(calls):
                calls.append(["", "", ""])
            pid, pname, pargs = prev[i] if i < len(prev) else ("", "", "")
            if (pname and name != pname) or (pid and cid != pid) or not args.startswith(pargs):
                fail(f"call {i} {(cid, name, args)!r} does not extend {(pid, pname, pargs)!r} at {answer!r}")
            calls[i][0], calls[i][1] = cid or calls[i][0], name or calls[i][1]
            calls[i][2] += args[len(pargs) :]
        prev_content, prev = partial.content, now

    answer = ""
    out = case.output
    for i in range(0, len(out), step):
        new = s.feed(out[i : i + step])
        pieces.extend(new)
        answer += "".join(p for p in new if type(p) is str)
        diff(answer)
    new = s.flush()
    pieces.extend(new)
    answer += "".join(p for p in new if type(p) is str)
    diff(answer)
    parts = join(pieces)
    got = []
    for cid, name, args in calls:
        try:
            value = json.loads(args)
        except ValueError:
            fail(f"call {name!r}: the streamed arguments {args!r} are not JSON")
            value = None
        got.append((name, value, cid))
    return Read(parts.reasoning, content, tuple(got))


def _raise(message: str) -> None:
    raise AssertionError(message)


def stored(reasoning: str, content: str, calls: list[tuple[str, dict[str, Any], str]]) -> dict[str, Any]:
    """The assistant message the session stores for a parsed reply, as the Runtime renders it back."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}} for n, a, i in calls
        ]
    return message
