"""Tool-call grammars: their shape, llama-server's triggers, and what llama.cpp's grammar sampler accepts
with them (run token by token on the tiny Qwen and Llama 3 models' vocabularies)."""

from __future__ import annotations

import ctypes
import math
from collections.abc import Iterator
from pathlib import Path

import llama_cpp
import msgspec
import pytest

from runtime.grammar.json_schema import json_schema_to_grammar
from runtime.tools import GenericFormat, HermesFormat, Llama3Format, ToolChoice, ToolGrammar, as_tools
from runtime.tools.llama3 import TRIGGER_PATTERN
from tests.support.tool_models import write_llama3, write_qwen

TOOLS = as_tools(
    [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather in a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            },
        },
        {
            "type": "function",
            "function": {
                "name": "add",
                "parameters": {
                    "type": "object",
                    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                    "required": ["a", "b"],
                },
            },
        },
    ]
)
AUTO, REQUIRED, NONE = ToolChoice("auto"), ToolChoice("required"), ToolChoice("none")


class Point(msgspec.Struct):
    x: int
    y: int


QWEN_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


class Vocab:
    """Runs llama.cpp's grammar sampler over the tokens of a text."""

    def __init__(self, path: Path) -> None:
        self.llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        self.vocab = self.llm._model.vocab
        self.n = self.llm.n_vocab()

    def accepts(self, grammar: ToolGrammar, text: str, *, then_eos: bool = True) -> bool:
        """True if every token of `text` (and then end of generation) is allowed by the grammar."""
        if grammar.lazy:
            pats = [p.encode() for p in grammar.patterns()]
            arr = (ctypes.c_char_p * len(pats))(*pats)
            smpl = llama_cpp.llama_sampler_init_grammar_lazy_patterns(
                self.vocab, grammar.gbnf.encode(), b"root", arr, len(pats), None, 0
            )
        else:
            smpl = llama_cpp.llama_sampler_init_grammar(self.vocab, grammar.gbnf.encode(), b"root")
        assert smpl, "llama.cpp refused the grammar"
        try:
            tokens = list(self.llm.tokenize(text.encode(), add_bos=False, special=True))
            for tok in [*tokens, self.llm.token_eos()] if then_eos else tokens:
                if not self._allowed(smpl, tok):
                    return False
                llama_cpp.llama_sampler_accept(smpl, tok)
            return True
        finally:
            llama_cpp.llama_sampler_free(smpl)

    def _allowed(self, smpl: llama_cpp.llama_sampler_p, tok: int) -> bool:
        data = (llama_cpp.llama_token_data * self.n)(*[llama_cpp.llama_token_data(i, 0.0, 0.0) for i in range(self.n)])
        cur = llama_cpp.llama_token_data_array(data=data, size=self.n, selected=-1, sorted=False)
        llama_cpp.llama_sampler_apply(smpl, ctypes.byref(cur))
        return not math.isinf(data[tok].logit)


@pytest.fixture(scope="module")
def vocabs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Vocab]]:
    d = tmp_path_factory.mktemp("grammar-models")
    out = {"qwen": Vocab(write_qwen(d / "q.gguf")), "llama3": Vocab(write_llama3(d / "l.gguf"))}
    yield out
    for v in out.values():
        v.llm.close()


def test_hermes_grammar_shape() -> None:
    g = HermesFormat().grammar(TOOLS, AUTO)
    assert g is not None and g.lazy and g.trigger_words == ("<tool_call>",) and g.trigger_patterns == ()
    assert g.patterns() == (r"^[\s\S]*?(<tool_call>)[\s\S]*",)
    lines = g.gbnf.splitlines()
    assert "root ::= tool-call" in lines
    assert 'tool-call ::= "<tool_call>" space any-tool-call "</tool_call>" space' in lines
    assert "any-tool-call ::= ( get-weather-call | add-call ) space" in lines
    required = HermesFormat().grammar(TOOLS, REQUIRED, parallel=True)
    assert required is not None and not required.lazy and required.patterns() == ()
    assert "root ::= tool-call+" in required.gbnf.splitlines()
    named = HermesFormat().grammar(TOOLS, ToolChoice("function", "add"))
    assert named is not None and not named.lazy and "get-weather" not in named.gbnf
    assert HermesFormat().grammar(TOOLS, NONE) is None


def test_hermes_grammar_in_llama_cpp(vocabs: dict[str, Vocab]) -> None:
    v = vocabs["qwen"]
    auto = HermesFormat().grammar(TOOLS, AUTO)
    assert auto is not None
    assert v.accepts(auto, QWEN_CALL)
    assert v.accepts(auto, "Let me check.\n" + QWEN_CALL)
    assert v.accepts(auto, "It is sunny, no call needed.")  # never triggered: free text
    assert not v.accepts(auto, QWEN_CALL.replace("get_weather", "get_wether"))
    assert not v.accepts(auto, QWEN_CALL.replace('"Paris"', "7"))
    assert not v.accepts(auto, QWEN_CALL + "\n" + QWEN_CALL)  # one call unless parallel
    assert not v.accepts(auto, QWEN_CALL[:-4])  # cannot end inside the call
    parallel = HermesFormat().grammar(TOOLS, AUTO, parallel=True)
    assert parallel is not None and v.accepts(parallel, QWEN_CALL + "\n" + QWEN_CALL)
    required = HermesFormat().grammar(TOOLS, REQUIRED)
    assert required is not None
    assert v.accepts(required, QWEN_CALL)
    assert not v.accepts(required, "Let me check.\n" + QWEN_CALL)


def test_llama3_grammar(vocabs: dict[str, Vocab]) -> None:
    g = Llama3Format().grammar(TOOLS, AUTO)
    assert g is not None and g.lazy and g.trigger_words == () and g.trigger_patterns == (TRIGGER_PATTERN,)
    v = vocabs["llama3"]
    call = '{"name": "add", "parameters": {"a": 1, "b": 2}}'
    assert v.accepts(g, call)
    assert v.accepts(g, '{"type": "function", "name": "add", "parameters": {"a": 1, "b": 2}}')
    assert v.accepts(g, "Two plus two is four.")
    assert not v.accepts(g, call.replace('"b": 2', '"b": "2"'))
    assert not v.accepts(g, '{"name": "sub", "parameters": {"a": 1, "b": 2}}')
    assert not v.accepts(g, call + " and more")
    required = Llama3Format().grammar(TOOLS, REQUIRED)
    assert required is not None and not required.lazy
    assert v.accepts(required, call) and not v.accepts(required, "Four.")
    assert Llama3Format().grammar(TOOLS, NONE) is None


def test_generic_schema_is_llama_servers() -> None:
    fmt = GenericFormat()
    weather_call = {
        "type": "object",
        "properties": {"name": {"type": "string", "const": "get_weather"}, "arguments": TOOLS[0].parameters},
        "required": ["name", "arguments"],
        "description": "Weather in a city.",
    }
    add_call = {
        "type": "object",
        "properties": {"name": {"type": "string", "const": "add"}, "arguments": TOOLS[1].parameters},
        "required": ["name", "arguments"],
        "description": "",
    }
    response = {"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"]}
    tool_call = {
        "type": "object",
        "properties": {"tool_call": {"anyOf": [weather_call, add_call]}},
        "required": ["tool_call"],
    }
    assert fmt.schema(TOOLS, AUTO) == {"anyOf": [tool_call, response]}
    assert fmt.schema(TOOLS, REQUIRED) == tool_call
    assert fmt.schema(TOOLS, ToolChoice("function", "add")) == {
        "type": "object",
        "properties": {"tool_call": add_call},
        "required": ["tool_call"],
    }
    par = fmt.schema(TOOLS[1:], AUTO, parallel=True)
    assert par is not None
    items = par["anyOf"][0]["properties"]["tool_calls"]
    assert items["minItems"] == 1 and items["items"]["required"] == ["name", "arguments", "id"]
    assert items["items"]["properties"]["id"] == {"type": "string", "minLength": 4}
    assert fmt.schema(TOOLS, NONE) is None
    g = fmt.grammar(TOOLS, AUTO)
    assert g is not None and not g.lazy and g.patterns() == ()
    assert g.gbnf == json_schema_to_grammar(fmt.schema(TOOLS, AUTO) or {})


def test_generic_grammar_in_llama_cpp(vocabs: dict[str, Vocab]) -> None:
    g = GenericFormat().grammar(TOOLS, AUTO)
    assert g is not None
    v = vocabs["qwen"]
    assert v.accepts(g, '{"tool_call": {"name": "add", "arguments": {"a": 1, "b": 2}}}')
    assert v.accepts(g, '{"response": "It is sunny."}')
    assert not v.accepts(g, "It is sunny.")
    assert not v.accepts(g, '{"tool_call": {"name": "add", "arguments": {"a": 1}}}')


def test_tool_with_defs_compiles(vocabs: dict[str, Vocab]) -> None:
    def paint(at: Point, label: str = "x") -> None:
        """Paint."""

    tools = as_tools([paint])
    for fmt in (HermesFormat(), Llama3Format(), GenericFormat()):
        g = fmt.grammar(tools, REQUIRED)
        assert g is not None and "point" in g.gbnf.lower()
    hermes = HermesFormat().grammar(tools, REQUIRED)
    assert hermes is not None
    text = '<tool_call>\n{"name": "paint", "arguments": {"at": {"x": 1, "y": 2}}}\n</tool_call>'
    assert vocabs["qwen"].accepts(hermes, text)
