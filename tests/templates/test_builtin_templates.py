"""llama.cpp's built-in chat template names (`--chat-template llama3`): each Jinja template turnstile has for a
name renders what llama.cpp's own `llama_chat_apply_template` renders for that name (its C++ format, through
llama-cpp-python's binding; no model needed), on conversations with and without a system message, several
turns, surrounding whitespace and without the generation prompt. A name of llama.cpp's turnstile has no Jinja
for, and an unknown name, are refused with a message naming the choices."""

from __future__ import annotations

import ctypes
from pathlib import Path

import llama_cpp
import pytest

from runtime.errors import InvalidConfig
from runtime.templates.apply import apply_template
from runtime.templates.builtin import BUILTIN, LLAMA_CPP_NAMES
from runtime.templates.load import chat_template_source

CONVERSATIONS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "Hi there"}],
    [{"role": "system", "content": "You are a test."}, {"role": "user", "content": "Hi there"}],
    [
        {"role": "system", "content": "  Be brief.\n"},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": " 4 "},
        {"role": "user", "content": "And 3+3?\n"},
    ],
]


def llama_cpp_render(name: str, messages: list[dict[str, str]], add_ass: bool) -> str:
    keep = [(m["role"].encode(), m["content"].encode()) for m in messages]
    chat = (llama_cpp.llama_chat_message * len(keep))(*(llama_cpp.llama_chat_message(r, c) for r, c in keep))
    buf = ctypes.create_string_buffer(1 << 14)
    n = llama_cpp.llama_chat_apply_template(name.encode(), chat, len(keep), add_ass, buf, len(buf))
    assert 0 <= n <= len(buf), (name, n)
    return buf.raw[:n].decode()


def test_names_are_llama_cpp_names() -> None:
    n = llama_cpp.llama_chat_builtin_templates(None, 0)
    out = (ctypes.c_char_p * n)()
    llama_cpp.llama_chat_builtin_templates(out, n)
    theirs = {s.decode() for s in out if s is not None}
    assert set(BUILTIN) <= theirs
    assert set(LLAMA_CPP_NAMES) == theirs


@pytest.mark.parametrize("name", sorted(BUILTIN))
@pytest.mark.parametrize("add_ass", [True, False])
def test_builtin_template_renders_as_llama_cpp(name: str, add_ass: bool) -> None:
    source = chat_template_source(name)
    for messages in CONVERSATIONS:
        want = llama_cpp_render(name, messages, add_ass)
        got = apply_template(source, messages, add_generation_prompt=add_ass)
        assert got == want, f"{name}: {got!r} != {want!r}"


def test_names_turnstile_lacks_and_unknown_names_are_refused() -> None:
    with pytest.raises(InvalidConfig, match=r"'orion' is not available in turnstile.*--chat-template-file"):
        chat_template_source("orion")
    with pytest.raises(InvalidConfig, match=r"unknown chat template name 'llama9'.*command-r"):
        chat_template_source("llama9")
    assert chat_template_source("{{ 'x' }}") == "{{ 'x' }}"  # Jinja source stays itself


def test_serve_flag_takes_a_name(tmp_path: Path) -> None:
    from runtime.cli import build_parser
    from runtime.cli import serve as cli_serve

    parser = build_parser()
    args = parser.parse_args(["serve", "--chat-template", "command-r", "--embedding", "--pooling", "mean"])
    cli_serve.check_arguments(parser, args)
    config = cli_serve.runtime_config(args, {"model": tmp_path / "m.gguf"})
    assert config.engine.chat_template == BUILTIN["command-r"] and config.engine.pooling == "mean"
    for bad in (["--chat-template", "llama9"], ["--chat-template", "llama3", "--chat-template-file", __file__]):
        args = parser.parse_args(["serve", *bad])
        with pytest.raises(SystemExit):
            cli_serve.check_arguments(parser, args)
