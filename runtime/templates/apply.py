"""`apply_template`: a conversation rendered exactly as llama-server's `POST /apply-template` renders it.

The render follows `common_chat_templates_apply_jinja` and `common_chat_template_direct_apply_impl`
(llama.cpp common/chat.cpp): the messages go through `messages.template_messages`; the template sees
`messages`, `bos_token`, `eos_token`, `enable_thinking` (true unless the request turns it off, false by
default for templates llama-server finds no thinking in), `tools` only when tools are offered (undefined
otherwise), `add_generation_prompt` only when true (undefined otherwise), `datetime` / `date_string`, and
every `chat_template_kwargs` entry; `preserve_reasoning` (true by default, as llama-server's
`--chat-template-kwargs` default) sets `preserve_thinking`, `clear_thinking`, `truncate_history_thinking` and
`drop_thinking`, and `reasoning_effort` sets `reasoning_effort` / `reasoning_strength`. After the render a
leading BOS is stripped when the model adds one itself (`add_bos`), a trailing EOS when it adds that
(`add_eos`); gpt-oss's last `<|return|>` becomes `<|end|>` without a generation prompt; Gemma 4 gets its
model turn opened after a tool round.

Pure: jinja2 only, no llama.cpp, safe to call from the event loop (a render of a long conversation costs
milliseconds: call it in a worker thread when that matters).
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jinja2

from caches.tokens import lcp
from runtime.errors import ChatTemplateError
from runtime.templates.caps import TemplateCaps, template_caps
from runtime.templates.engine import TemplateRaised, compile_template
from runtime.templates.messages import parse_messages, parse_tools, template_messages

__all__ = ["CHATML_TEMPLATE", "apply_template", "default_enable_thinking", "template_caps"]

CHATML_TEMPLATE = (
    "{%- for message in messages -%}\n"
    "  {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|im_start|>assistant\n' -}}\n"
    "{%- endif -%}"
)
"""llama.cpp's fallback template (CHATML_TEMPLATE_SRC) for a model that has none."""

_TAG = re.compile(r"<[^<>\s]+>|\[/?[A-Z_]+\]")  # markup: <think>, </think>, <|START_THINKING|>, [THINK]


def default_enable_thinking(source: str) -> bool:
    """llama-server's default `enable_thinking` for a template: on when it finds a reasoning block in it.

    llama-server asks its parser generator whether the template has thinking; the same answer, found
    without it: what follows the user's message (the generation prompt) changes markup (`<think>`, `[THINK]`)
    with `enable_thinking`, or
    an assistant message's `reasoning_content` is rendered. A template that reads the switch only
    elsewhere (Apertus, in its system preamble) gets `enable_thinking=false` by default, as from llama-server.
    """
    return _supports_thinking(source)


@functools.lru_cache(maxsize=64)
def _supports_thinking(source: str) -> bool:
    if "enable_thinking" not in source and "reasoning_content" not in source:
        return False
    mark = "USER_MARKER_7f3a"
    user = [{"role": "user", "content": mark}]

    def gen(enabled: bool) -> str:
        """What the template writes after the user's message (the generation prompt and any framing)."""
        v = {"messages": user, "bos_token": "", "eos_token": "", "enable_thinking": enabled}
        try:
            full = _render(source, {**v, "add_generation_prompt": True})
        except ChatTemplateError:
            return ""
        return full.rsplit(mark, 1)[-1]

    on, off = gen(True), gen(False)
    if on != off:
        n = lcp(on, off)
        m = lcp(on[n:][::-1], off[n:][::-1])
        if any(_TAG.search(x[n : len(x) - m]) for x in (on, off)):
            return True
    marker = "<REASONING_MARKER_7f3a>"
    msgs = [*user, {"role": "assistant", "content": "A", "reasoning_content": marker}]
    try:
        out = _render(source, {"messages": msgs, "bos_token": "", "eos_token": "", "enable_thinking": True})
    except ChatTemplateError:
        return False
    return marker in out


def _render(source: str, variables: dict[str, Any]) -> str:
    try:
        tmpl = compile_template(source)
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(f"the chat template does not parse: {e.message} (line {e.lineno})") from e
    try:
        return tmpl.render(variables)
    except TemplateRaised as e:
        raise ChatTemplateError(f"the chat template refused the conversation: {e}") from e
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"the chat template failed: {e}") from e
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
        raise ChatTemplateError(f"the chat template failed: {type(e).__name__}: {e}") from e


def template_variables(
    source: str,
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None,
    add_generation_prompt: bool,
    chat_template_kwargs: Mapping[str, Any] | None,
    bos_token: str,
    eos_token: str,
    now: float | None = None,
) -> dict[str, Any]:
    """The variables the template renders with (see the module docstring)."""
    kwargs = {"preserve_reasoning": True, **(chat_template_kwargs or {})}
    et = kwargs.get("enable_thinking", default_enable_thinking(source))
    if not isinstance(et, bool):
        raise ChatTemplateError(f"enable_thinking must be a boolean, not {type(et).__name__}")
    inp: dict[str, Any] = {"messages": messages, "bos_token": bos_token, "eos_token": eos_token}
    inp["enable_thinking"] = et
    if tools:
        inp["tools"] = tools
    t = time.localtime(now)
    inp["datetime"] = time.strftime("%b %d %Y", t)
    inp["date_string"] = time.strftime("%d %b %Y", t)
    inp.update(kwargs)
    if add_generation_prompt:
        inp["add_generation_prompt"] = True
    v: dict[str, Any] = {}  # set before the inputs, which win over them (as in llama.cpp)
    pr = inp.get("preserve_reasoning")
    if isinstance(pr, bool):
        v.update(preserve_thinking=pr, clear_thinking=not pr, truncate_history_thinking=not pr, drop_thinking=not pr)
    effort = inp.get("reasoning_effort")
    if isinstance(effort, str) and effort:
        v.update(reasoning_effort=effort, reasoning_strength=effort)
    v.update(inp)
    return v


def apply_template(
    source: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    bos_token: str = "",
    eos_token: str = "",
    add_bos: bool = False,
    add_eos: bool = False,
) -> str:
    """The prompt llama-server's `/apply-template` gives for these messages (and tools, and variables).

    `messages` are OpenAI-style dicts (`role`, `content` (a string, text parts or null), `tool_calls`,
    `tool_call_id`, `name`, `reasoning_content`); `tools` OpenAI tool definitions. A trailing assistant
    message is rendered as it is (llama-server's `--no-prefill-assistant`). `add_bos` / `add_eos`: the
    model's tokenizer adds BOS / EOS itself, so a leading BOS / trailing EOS the template writes is removed.
    Raises `ChatTemplateError` for malformed messages, a template that does not parse, or one that refuses
    the conversation.
    """
    if not isinstance(source, str) or not source:
        raise ChatTemplateError("the chat template is empty")
    if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, Mapping):
        raise ChatTemplateError("chat_template_kwargs must be a mapping of template variables")
    caps = caps_of(source)
    msgs = template_messages(source, parse_messages(messages), caps)
    variables = template_variables(
        source,
        msgs,
        tools=parse_tools(tools),
        add_generation_prompt=add_generation_prompt,
        chat_template_kwargs=chat_template_kwargs,
        bos_token=bos_token,
        eos_token=eos_token,
    )
    prompt = _render(source, variables)
    if add_bos and bos_token and prompt.startswith(bos_token):
        prompt = prompt[len(bos_token) :]
    if add_eos and eos_token and prompt.endswith(eos_token):
        prompt = prompt[: -len(eos_token)]
    if "<|channel|>" in source and not add_generation_prompt:
        pos = prompt.rfind("<|return|>")
        if pos >= 0:
            prompt = prompt[:pos] + "<|end|>" + prompt[pos + len("<|return|>") :]
    if "'<|tool_call>call:'" in source and add_generation_prompt and prompt.endswith("<turn|>\n"):
        prompt += "<|turn>model\n"
    return prompt


def caps_of(source: str) -> TemplateCaps:
    """The template's caps (cached per source)."""
    return template_caps(source)
