"""Token literals in raw GBNF grammars (`<|channel|>`, `<[id]>`): found as llama.cpp's parser finds them, run on a
tiny model with gpt-oss's specials, and refused with `InvalidGrammar` before anything is queued when llama.cpp could
never match them (an end-of-generation token: llama.cpp would throw "Unexpected empty grammar stack" through ctypes,
an abort of the process; llama-server answers 500). A grammar that still dead-ends mid-reply is a typed error too,
and the Runtime goes on."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime import Runtime
from runtime.errors import InvalidGrammar, InvalidRequest
from runtime.grammar.tokens import TokenLiteral, token_literals
from tests.support.reasoning_models import vendored_template, write_harmony

HI = [{"role": "user", "content": "hi"}]


def test_token_literals_are_found_outside_strings_classes_and_comments() -> None:
    gbnf = 'root ::= "<|a|>" [<>] <|channel|> !<[7]> x # <|call|>\nx ::= "\\"<b>" <[12]> "[" <c>'
    assert token_literals(gbnf) == [
        TokenLiteral("<|channel|>", None, False),
        TokenLiteral("<[7]>", 7, True),
        TokenLiteral("<[12]>", 12, False),
        TokenLiteral("<c>", None, False),
    ]
    assert token_literals('root ::= "<think>" [a-z]*') == []


@pytest.fixture(scope="module")
def harmony(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield write_harmony(tmp_path_factory.mktemp("harmony") / "oss.gguf", vendored_template("openai-gpt-oss-120b.jinja"))


@pytest.mark.anyio
async def test_token_literals_run_and_end_of_generation_ones_are_refused(harmony: Path) -> None:
    async with Runtime.open(harmony, n_ctx=1024, n_threads=1) as rt:
        eng = rt.backend.engine  # type: ignore[attr-defined]
        call, channel = (eng.tokenize(t, add_special=False, parse_special=True) for t in ("<|call|>", "<|channel|>"))
        assert eng.is_eog(call[0]) and not eng.is_eog(channel[0])
        reply = await rt.complete(HI, grammar='root ::= <|channel|> "final" <|message|> "ok"', temperature=0)
        assert (reply.text, reply.reasoning) == ("ok", "")  # the harmony markers were the special tokens
        for bad, why in (
            ('root ::= "x" <|call|>', "<|call|> is an end-of-generation token"),
            ('root ::= "x" <|return|>', "<|return|> is an end-of-generation token"),
            (f'root ::= "x" <[{call[0]}]>', f"<[{call[0]}]> is an end-of-generation token"),
            ('root ::= "x" <[999999]>', "not a token id of this model"),
            ('root ::= "x" <|nope|>', "does not parse"),
        ):
            with pytest.raises(InvalidGrammar, match=why.replace("[", r"\[").replace("|", r"\|")) as info:
                await rt.complete(HI, grammar=bad, max_tokens=4)
            assert isinstance(info.value, InvalidRequest)  # the same category as before (HTTP 400)
        # negated, commented out or quoted: fine (the quoted one is spelled in text tokens)
        for ok in ('root ::= "x" !<|call|> "y"', 'root ::= "x" # <|call|>\n', 'root ::= "x" "<|call|>"'):
            await rt.complete(HI, grammar=ok, max_tokens=12, temperature=0)
        # the grammar is complete and ignore_eos bans the only tokens it then allows: a typed error, not an abort
        with pytest.raises(InvalidGrammar, match="allows no token"):
            await rt.complete(HI, grammar='root ::= "x"', ignore_eos=True, max_tokens=5, temperature=0)
        assert (await rt.complete(HI, grammar='root ::= "fine"', temperature=0)).text == "fine"
