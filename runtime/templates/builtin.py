"""llama.cpp's built-in chat template names (`--chat-template chatml`, `llama3`, `command-r`, ...) as Jinja.

llama-server accepts a name of `LLM_CHAT_TEMPLATES` (src/llama-chat.cpp) for `--chat-template` and renders
it with `llm_chat_apply_template`'s C++ format. turnstile renders every prompt with Jinja (tool offers,
reasoning and the incremental render work on that), so each name here is a Jinja template written to give
exactly that C++ format's text (tests/test_builtin_templates.py checks each against llama.cpp's own
`llama_chat_apply_template` on several conversations). llama.cpp's names not listed here are refused by name
(`UNSUPPORTED`: the message says which names there are and that `--chat-template-file` takes any template);
a value that is neither a name nor Jinja nor a file is refused too.
"""

from __future__ import annotations

from runtime.templates.apply import CHATML_TEMPLATE

__all__ = ["BUILTIN", "LLAMA_CPP_NAMES", "builtin_source"]


def _loop(body: str, generation: str) -> str:
    tail = "{%- if add_generation_prompt -%}{{- '" + generation + "' -}}{%- endif -%}" if generation else ""
    return "{%- for message in messages -%}" + body + "{%- endfor -%}" + tail


_TRIM = "message.content | trim"

BUILTIN: dict[str, str] = {
    "chatml": CHATML_TEMPLATE,
    "llama3": _loop(
        "{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + (" + _TRIM + ") + '<|eot_id|>' -}}",
        "<|start_header_id|>assistant<|end_header_id|>\\n\\n",
    ),
    "command-r": _loop(
        "{%- set tok = {'system': 'SYSTEM', 'user': 'USER', 'assistant': 'CHATBOT'}.get(message.role) -%}"
        "{%- if tok -%}{{- '<|START_OF_TURN_TOKEN|><|' + tok + '_TOKEN|>' + ("
        + _TRIM
        + ") + '<|END_OF_TURN_TOKEN|>' -}}"
        "{%- endif -%}",
        "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
    ),
    "phi3": _loop("{{- '<|' + message.role + '|>\\n' + message.content + '<|end|>\\n' -}}", "<|assistant|>\\n"),
    "phi4": _loop(
        "{{- '<|im_start|>' + message.role + '<|im_sep|>' + message.content + '<|im_end|>' -}}",
        "<|im_start|>assistant<|im_sep|>",
    ),
    "falcon3": _loop("{{- '<|' + message.role + '|>\\n' + message.content + '\\n' -}}", "<|assistant|>\\n"),
    "zephyr": _loop("{{- '<|' + message.role + '|>\\n' + message.content + '<|endoftext|>\\n' -}}", "<|assistant|>\\n"),
    "monarch": _loop(
        "{{- ('' if loop.first else '<s>') + message.role + '\\n' + message.content + '</s>\\n' -}}",
        "<s>assistant\\n",
    ),
    "gemma": "{%- set ns = namespace(system='') -%}"
    + _loop(
        "{%- if message.role == 'system' -%}{%- set ns.system = ns.system + (" + _TRIM + ") -%}{%- else -%}"
        "{%- set role = 'model' if message.role == 'assistant' else message.role -%}"
        "{{- '<start_of_turn>' + role + '\\n' -}}"
        "{%- if ns.system and role != 'model' -%}{{- ns.system + '\\n\\n' -}}{%- set ns.system = '' -%}{%- endif -%}"
        "{{- (" + _TRIM + ") + '<end_of_turn>\\n' -}}{%- endif -%}",
        "<start_of_turn>model\\n",
    ),
    "deepseek3": _loop(
        "{%- if message.role == 'system' -%}{{- message.content + '\\n\\n' -}}"
        "{%- elif message.role == 'user' -%}{{- '<｜User｜>' + message.content -}}"
        "{%- elif message.role == 'assistant' -%}{{- '<｜Assistant｜>' + message.content + '<｜end▁of▁sentence｜>' -}}"
        "{%- endif -%}",
        "<｜Assistant｜>",
    ),
    "mistral-v7": _loop(
        "{%- if message.role == 'system' -%}{{- '[SYSTEM_PROMPT] ' + message.content + '[/SYSTEM_PROMPT]' -}}"
        "{%- elif message.role == 'user' -%}{{- '[INST] ' + message.content + '[/INST]' -}}"
        "{%- else -%}{{- ' ' + message.content + '</s>' -}}{%- endif -%}",
        "",
    ),
    "mistral-v7-tekken": _loop(
        "{%- if message.role == 'system' -%}{{- '[SYSTEM_PROMPT]' + message.content + '[/SYSTEM_PROMPT]' -}}"
        "{%- elif message.role == 'user' -%}{{- '[INST]' + message.content + '[/INST]' -}}"
        "{%- else -%}{{- message.content + '</s>' -}}{%- endif -%}",
        "",
    ),
}

# every name of llama.cpp's LLM_CHAT_TEMPLATES (src/llama-chat.cpp), for the error message
LLAMA_CPP_NAMES: tuple[str, ...] = (
    "chatml", "llama2", "llama2-sys", "llama2-sys-bos", "llama2-sys-strip", "mistral-v1", "mistral-v3",
    "mistral-v3-tekken", "mistral-v7", "mistral-v7-tekken", "phi3", "phi4", "falcon3", "zephyr", "monarch", "gemma",
    "orion", "openchat", "vicuna", "vicuna-orca", "deepseek", "deepseek2", "deepseek3", "deepseek-ocr", "command-r",
    "llama3", "chatglm3", "chatglm4", "glmedge", "minicpm", "exaone3", "exaone4", "exaone-moe", "rwkv-world",
    "granite", "granite-4.0", "granite-4.1", "gigachat", "megrez", "yandex", "bailing", "bailing-think", "bailing2",
    "llama4", "smolvlm", "hunyuan-moe", "gpt-oss", "hunyuan-dense", "hunyuan-vl", "kimi-k2", "seed_oss", "grok-2",
    "pangu-embedded", "solar-open",
)  # fmt: skip


def builtin_source(name: str) -> str | None:
    """The Jinja source for a built-in name, or None when `name` is not one of llama.cpp's names. A name of
    llama.cpp's that turnstile has no Jinja for raises KeyError with the message to show."""
    if name in BUILTIN:
        return BUILTIN[name]
    if name in LLAMA_CPP_NAMES:
        raise KeyError(
            f"llama.cpp's built-in chat template {name!r} is not available in turnstile (it renders with Jinja); "
            f"give the model's template with --chat-template-file, or one of: {', '.join(sorted(BUILTIN))}"
        )
    return None
