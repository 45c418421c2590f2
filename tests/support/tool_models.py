# ruff: noqa: E501  (the templates keep their own long lines)
"""Tiny GGUF models whose chat templates render tools: a Qwen 2.5 one and a Llama 3.x-style one.

They reuse tests/models.py's tensors (a 2-layer llama transformer with random weights) with their own
vocabulary: every token string is unique, the template's special tokens are single tokens (role markers
CONTROL; `<tool_call>`, `</tool_call>` and `<|python_tag|>` USER_DEFINED, so they detokenize to their
text as in the real models), and no space prefix is added (like the real models' BPE tokenizers).
"""

from __future__ import annotations

import string
from pathlib import Path

import gguf

from tests.support.tiny_models import _WORDS, Vocab, write_llama
from tests.support.vendor import vendored_template

# Qwen/Qwen2.5-7B-Instruct's chat template, read from the llama.cpp tree llama-cpp-python vendors (third-party
# text is not kept in this repository); fetched on first use, not at import.
QWEN25_TEMPLATE_NAME = "Qwen-Qwen2.5-7B-Instruct.jinja"


def qwen25_template() -> str:
    """Qwen 2.5's chat template, verbatim (llama.cpp's models/templates/Qwen-Qwen2.5-7B-Instruct.jinja)."""
    return vendored_template(QWEN25_TEMPLATE_NAME)


# A Llama 3.x-style template (condensed from Llama 3.2's): tools go in the system message unless
# tools_in_user_message; a tool call is rendered as {"name": ..., "parameters": ...}; tool results as ipython.
LLAMA3_TEMPLATE = """{{- bos_token }}
{%- if not tools_in_user_message is defined %}{%- set tools_in_user_message = true %}{%- endif %}
{%- if not date_string is defined %}{%- set date_string = "26 Jul 2024" %}{%- endif %}
{%- if not tools is defined %}{%- set tools = none %}{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none %}{{- "Environment: ipython\\n" }}{%- endif %}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

_CONTROL, _USER = int(gguf.TokenType.CONTROL), int(gguf.TokenType.USER_DEFINED)

QWEN_SPECIALS = [("<|endoftext|>", _CONTROL), ("<|im_start|>", _CONTROL), ("<|im_end|>", _CONTROL)]
QWEN_SPECIALS += [("<tool_call>", _USER), ("</tool_call>", _USER)]
LLAMA3_SPECIALS = [
    ("<|begin_of_text|>", _CONTROL),
    ("<|end_of_text|>", _CONTROL),
    ("<|start_header_id|>", _CONTROL),
    ("<|end_header_id|>", _CONTROL),
    ("<|eot_id|>", _CONTROL),
    ("<|eom_id|>", _CONTROL),
    ("<|python_tag|>", _USER),
]


def _vocab(specials: list[tuple[str, int]], template: str, bos: str, eos: str) -> Vocab:
    normal, byte = int(gguf.TokenType.NORMAL), int(gguf.TokenType.BYTE)
    toks: list[tuple[str, float, int]] = [("<unk>", 0.0, int(gguf.TokenType.UNKNOWN))]
    toks += [(s, 0.0, t) for s, t in specials]
    toks += [(f"<0x{b:02X}>", 0.0, byte) for b in range(256)]
    pieces = ["▁", *string.ascii_letters, *string.digits, *".,!?;:'\"-(){}[]_<>/|#=", "▁"]
    pieces += ["▁" + w for w in _WORDS] + [w for w in _WORDS if len(w) > 1]
    pieces += ["name", "arguments", "parameters", "function", "tool", "call", "add", "weather", "city"]
    seen = {t[0] for t in toks}
    for i, p in enumerate(pieces):
        if p not in seen:
            seen.add(p)
            toks.append((p, -float(i) / 1000.0 + len(p), normal))
    ids = {t[0]: i for i, t in enumerate(toks)}
    tokens, scores, types = [t[0].encode() for t in toks], [t[1] for t in toks], [t[2] for t in toks]
    return Vocab(tokens, scores, types, bos=ids[bos], eos=ids[eos], template=template, space_prefix=False)


def write_qwen(path: Path, *, seed: int = 11) -> Path:
    """A tiny llama with Qwen 2.5's chat template (tools rendered in the system message, `<tool_call>`)."""
    vocab = _vocab(QWEN_SPECIALS, qwen25_template(), "<|endoftext|>", "<|im_end|>")
    return write_llama(path, seed=seed, vocab=vocab)


def write_llama3(path: Path, *, seed: int = 12) -> Path:
    """A tiny llama with a Llama 3.x-style chat template (`{"name", "parameters"}` calls, ipython results)."""
    vocab = _vocab(LLAMA3_SPECIALS, LLAMA3_TEMPLATE, "<|begin_of_text|>", "<|eot_id|>")
    return write_llama(path, seed=seed, vocab=vocab)
