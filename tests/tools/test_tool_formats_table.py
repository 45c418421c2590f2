"""The tool-format table: one line per vendored template that renders tools or tool calls (docs/tools.md, "Tool-call
formats"; regenerate with `pytest -s tests/tools/test_tool_formats_table.py`), and the checks behind it.

For each template: the family `detect_format` finds; its cases of tests/support/tool_cases.py that pass (parse and
reconstruction as tests/tools/test_tool_formats_cases.py reads them); and a probe made from the template itself: the
assistant tool call `special_function({"arg1": 1})` rendered by the template (the text after the generation
prompt, without the end-of-turn the template writes after it) is what the model was trained to write, so it
must parse back to that call (probe parse), and the parsed reply, stored and rendered back into the
conversation, must give back exactly the prompt and that text (reconstruction: the next turn reuses the reply
from the cache). Where it does not, the table says how many characters of the reply would be prefilled again.

Every template must be native (not the generic JSON protocol) unless it is in GENERIC with a reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pytest

from runtime.errors import ChatTemplateError, ToolCallParseError
from runtime.reasoning import Splitter, join
from runtime.templates import template_caps
from runtime.tools import GenericFormat, template_uses_tools
from tests.support.tool_cases import CASES, Case
from tests.support.tool_reading import SEED, TemplateView, read_whole, stored, view
from tests.support.vendor_tree import vendored_tree

PROBE_ARGS = {"arg1": 1}
PROBE_ID = "call0A1b2"  # nine alphanumerics: Mistral templates insist
USER = {"role": "user", "content": "Hey there"}
PROBE = Case("probe", "", "", tools=("special_function",))

# templates that render tools but that llama-server itself reads with its generic JSON handling (reason each)
GENERIC: dict[str, str] = {}


def _lcp(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@dataclass(frozen=True)
class Row:
    template: str
    family: str
    cases: tuple[int, int]  # (passed, total)
    parse: str  # "pass", or why not
    reconstruction: str  # "pass", or how many characters of the reply are prefilled again


def probe_call() -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": PROBE_ID, "type": "function", "function": {"name": "special_function", "arguments": PROBE_ARGS}}
        ],
    }


def render(v: TemplateView, messages: list[dict[str, Any]], *, generation: bool) -> str:
    return v.prompt(PROBE, messages, generation=generation)


_TOKEN = re.compile(r"<[|｜][^<>|｜]*[|｜]>|<SPECIAL_\d+>")  # special-token markup
_EOG = re.compile(r"(<[|｜][^<>|｜]*[|｜]>|<SPECIAL_\d+>)\s*$")  # an end-of-generation token the slot does not emit


def sample(v: TemplateView) -> tuple[str, str]:
    """(the prompt, the text the template writes for the probe call after it, end-of-turn removed).

    A generation prompt that opens a reasoning block the history render closes or drops (QwQ, R1, Nemotron):
    the model's text is the closer and the call after it (what it writes for an empty reasoning block)."""
    prompt = render(v, [USER], generation=True)
    whole = render(v, [USER, probe_call()], generation=False)
    marker = "\x00END\x00"
    ended = render(v, [USER, {"role": "assistant", "content": marker}], generation=False)
    suffix = ended[ended.find(marker) + len(marker) :] if marker in ended else ""
    fmt = v.reasoning
    if whole.startswith(prompt):
        out = whole[len(prompt) :]
    elif fmt is not None and fmt.opens_block(prompt) and whole.startswith(base := prompt[: prompt.rfind(fmt.start)]):
        rest = whole[len(base) :]
        if rest.lstrip().startswith(fmt.start) and fmt.end in rest:  # the history's (empty) block
            rest = rest[rest.find(fmt.end) + len(fmt.end) :]
        elif fmt.preamble and rest.lstrip().startswith(fmt.start):  # the opener is the turn's header (Apriel 1.6)
            rest = rest.lstrip()[len(fmt.start) :].lstrip()
        out = rest if rest.lstrip().startswith(fmt.end) else fmt.end + rest  # (GLM writes the closer alone)
    else:  # the generation prompt writes what the history does not (Command R+'s tool-use system turn)
        at = _lcp(prompt, whole)
        cut = next((m.start() for m in _TOKEN.finditer(whole) if m.start() < at < m.end()), at)
        rest = whole[cut:]  # not from inside a special token: the model's text starts after the turn header
        head = next((n for n in range(len(rest), 0, -1) if prompt.endswith(rest[:n])), 0)
        out = rest[head:]
    if suffix and out.endswith(suffix):
        out = out[: -len(suffix)]
    # a template that writes the next turn's header after a call (R7B, the R1 distills): the reply ends at the
    # first end-of-turn token its content messages end with
    # (not a token of the family's call markup: Kimi K3 closes its sections with <|close|> ... <|sep|>)
    syntax = getattr(v.tools, "syntax", None)
    markup = " ".join(str(x) for x in vars(syntax).values()) if syntax is not None else ""
    ends = [at for t in _TOKEN.findall(suffix) if t not in markup and (at := out.find(t)) >= 0 and out[:at].strip()]
    return prompt, out[: min(ends)] if ends else out


def read(v: TemplateView, prompt: str, text: str) -> tuple[str, str, list[tuple[str, dict[str, Any], str]]]:
    fmt = v.reasoning
    inside = fmt is not None and fmt.opens_block(prompt)
    prefix = prompt[prompt.rfind(fmt.start) :] if fmt is not None and inside else ""
    s = Splitter(fmt, inside=inside, prefix=prefix)
    parts = join(s.feed(text) + s.flush())
    reply = v.plan(PROBE).parse(parts.content, seed=SEED)
    return parts.reasoning, reply.content, [(c.name, dict(c.arguments), c.id) for c in reply.tool_calls]


def reconstruction(
    v: TemplateView, case: Case, expected: str, message: dict[str, Any], base: list[dict[str, Any]]
) -> str:
    again = v.prompt(case, [*base, message], generation=False)
    if again.startswith(expected):
        return "pass"
    return f"{len(expected) - _lcp(again, expected)} chars again"


def case_passes(case: Case) -> bool:
    try:
        got = read_whole(case)
    except ToolCallParseError:
        return case.error
    except Exception:  # an engine bug: the case fails (tests/tools/test_tool_formats_cases.py shows it)
        return False
    if case.error:
        return False
    calls = [(n, a) for n, a, _ in got.calls]
    ok = got.content == case.content and calls == [(c.name, c.arguments) for c in case.calls]
    ok = ok and all(c.id is None or c.id == i for c, (_, _, i) in zip(case.calls, got.calls, strict=True))
    if ok and case.reconstruct:
        v = view(case.template)
        message = stored(got.reasoning, got.content, list(got.calls))
        ok = reconstruction(v, case, v.prompt(case) + case.output, message, [USER]) == "pass"
    return ok


def row(name: str) -> Row:
    try:
        return probe_row(name)
    except Exception as e:  # an engine bug: shown in the table, failed by the tests below
        return Row(name, "?", (0, 0), f"error {type(e).__name__}: {str(e)[:40]}", "-")


def probe_row(name: str) -> Row:
    v = view(name)
    mine = [c for c in CASES if c.template == name]
    passed = sum(case_passes(c) for c in mine)
    try:
        prompt, text = sample(v)
    except ChatTemplateError as e:
        return Row(name, v.tools.name, (passed, len(mine)), f"render refused ({str(e)[:40]})", "-")
    try:
        reasoning, content, calls = read(v, prompt, text)
    except ToolCallParseError as e:
        # the call's message may end in an end-of-generation token its content messages do not have
        # (functionary's <|eom_id|>), or in one of the format's stop strings (Gemma 4's <|tool_response>): the
        # model stops there and the slot does not emit it
        cut = text
        for stop in v.tools.stops:
            cut = cut.removesuffix(stop)
        cut = _EOG.sub("", text) if cut == text else cut
        try:
            if cut == text:
                raise
            reasoning, content, calls = read(v, prompt, cut)
            text = cut
        except ToolCallParseError:
            return Row(name, v.tools.name, (passed, len(mine)), f"fail: {str(e)[:50]}", "-")
    if not text.strip():
        return Row(name, v.tools.name, (passed, len(mine)), "no call rendered", "-")
    good = [(n, a) for n, a, _ in calls] == [("special_function", PROBE_ARGS)] and not content.strip()
    parse = "pass" if good else f"fail: {len(calls)} calls, content {content[:30]!r}"
    recon = reconstruction(v, PROBE, prompt + text, stored(reasoning, content, calls), [USER]) if good else "-"
    return Row(name, v.tools.name, (passed, len(mine)), parse, recon)


def tool_templates() -> list[str]:
    names = []
    for path in sorted((vendored_tree() / "models" / "templates").glob("*.jinja")):
        source = path.read_text()
        if template_uses_tools(source) or template_caps(source).supports_tool_calls:
            names.append(path.name)
    return names


@pytest.fixture(scope="module")
def rows() -> list[Row]:
    return [row(name) for name in tool_templates()]


def table(rows: list[Row]) -> str:
    lines = ["| template | family | cases | probe parse | reconstruction |", "|---|---|---|---|---|"]
    for r in rows:
        cases = f"{r.cases[0]}/{r.cases[1]}" if r.cases[1] else "-"
        lines.append(f"| {r.template.removesuffix('.jinja')} | {r.family} | {cases} | {r.parse} | {r.reconstruction} |")
    native = sum(r.family != GenericFormat.name for r in rows)
    lines.append("")
    lines.append(
        f"{len(rows)} templates; {native} native; probe parse {sum(r.parse == 'pass' for r in rows)} pass; "
        f"reconstruction {sum(r.reconstruction == 'pass' for r in rows)} pass; "
        f"cases {sum(r.cases[0] for r in rows)}/{sum(r.cases[1] for r in rows)}"
    )
    return "\n".join(lines)


def test_print_the_table(rows: list[Row]) -> None:
    print("\n" + table(rows))  # the table in docs/tools.md, regenerated with -s
    assert len(rows) >= 45


def test_every_template_that_renders_tools_is_native(rows: list[Row]) -> None:
    generic = {r.template for r in rows if r.family == GenericFormat.name}
    assert generic - set(GENERIC) == set()
    assert set(GENERIC) - generic == set()  # the list holds nothing stale


def test_every_native_template_parses_its_own_call(rows: list[Row]) -> None:
    failed = [(r.template, r.parse) for r in rows if r.family != GenericFormat.name and r.parse != "pass"]
    assert [f for f in failed if f[1] != "no call rendered"] == []
