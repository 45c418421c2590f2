"""Token literals in a GBNF grammar (`<think>`, `<|channel|>`, `<[42]>`, and negated `!<...>`), found as llama.cpp's
grammar parser (src/llama-grammar.cpp) finds them: outside string literals, character classes and comments.

llama.cpp matches a token literal against the sampled token's id, not its text; `<text>` must tokenize (special
tokens parsed) to exactly one token. Its sampler never lets an end-of-generation token through before the grammar
is complete, so a literal naming one (gpt-oss's `<|call|>` or `<|return|>`) can never match: the grammar dead-ends
and llama.cpp throws "Unexpected empty grammar stack" (an abort through ctypes). `runtime.llama.sampler`
refuses such a grammar with the ids this module finds.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TokenLiteral", "token_literals"]


@dataclass(frozen=True)
class TokenLiteral:
    """One token literal: `text` (`<...>` as written) or `token_id` (`<[id]>`), and whether it is negated (`!`)."""

    text: str
    token_id: int | None
    negated: bool


def _skip_quoted(src: str, i: int, close: str) -> int:
    """The index after the literal or class that starts at `src[i]` (escapes skipped)."""
    i += 1
    while i < len(src) and src[i] != close:
        i += 2 if src[i] == "\\" else 1
    return i + 1


def token_literals(gbnf: str) -> list[TokenLiteral]:
    """Every token literal of `gbnf`, in order (a grammar llama.cpp parses; anything else gives a best effort)."""
    out: list[TokenLiteral] = []
    i, n = 0, len(gbnf)
    while i < n:
        ch = gbnf[i]
        if ch == '"':
            i = _skip_quoted(gbnf, i, '"')
        elif ch == "[":
            i = _skip_quoted(gbnf, i, "]")
        elif ch == "#":
            nl = gbnf.find("\n", i)
            i = n if nl < 0 else nl + 1
        elif ch == "<" or (ch == "!" and gbnf.startswith("<", i + 1)):
            negated = ch == "!"
            start = i + 1 if negated else i
            end = gbnf.find(">", start + 1)
            if end < 0:
                return out
            body = gbnf[start + 1 : end]
            if body.startswith("[") and body.endswith("]") and body[1:-1].isdigit():
                out.append(TokenLiteral(gbnf[start : end + 1], int(body[1:-1]), negated))
            else:
                out.append(TokenLiteral(gbnf[start : end + 1], None, negated))
            i = end + 1
        else:
            i += 1
    return out
