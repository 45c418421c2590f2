"""GBNF grammars for tool calls, composed with the JSON-schema converter (`runtime.grammar.json_schema`).

A `ToolGrammar` is data for the sampler: the grammar text (root rule `root`), whether it is lazy, and
what triggers a lazy grammar. Trigger semantics are llama.cpp's (`llama_sampler_init_grammar_lazy_patterns`):
a trigger word may appear anywhere in the output and the grammar applies from the word on (the word
itself is the first thing the grammar matches); a trigger pattern must match the whole output so far
(`std::regex_match`) and the grammar applies from the start of its first capture group. `patterns()`
gives both kinds as llama.cpp patterns, the way llama-server builds them (a word that is one token may
instead be passed as a trigger token).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["GrammarBuilder", "ToolGrammar", "gbnf_literal"]


@dataclass(frozen=True)
class ToolGrammar:
    """A grammar the sampler applies to a tool-using reply; `lazy` ones wait for a trigger."""

    gbnf: str
    lazy: bool
    trigger_words: tuple[str, ...] = ()
    trigger_patterns: tuple[str, ...] = ()

    def patterns(self) -> tuple[str, ...]:
        """All triggers as llama.cpp lazy-grammar patterns (words become "anywhere" patterns)."""
        out = list(self.trigger_patterns)
        if self.trigger_words:
            words = "|".join(re.escape(w) for w in self.trigger_words)
            out.append(r"^[\s\S]*?(" + words + r")[\s\S]*")
        return tuple(out)


_LITERAL_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def gbnf_literal(text: str) -> str:
    """`text` as a GBNF string literal."""
    return '"' + "".join(_LITERAL_ESCAPES.get(c, c) for c in text) + '"'


class GrammarBuilder:
    """Adds JSON-schema rules and hand-written rules to one converter, then formats the grammar."""

    def __init__(self) -> None:
        from runtime.grammar.json_schema import (  # type: ignore[import-not-found,import-untyped,unused-ignore]
            SchemaConverter,
        )

        self._converter = SchemaConverter(prop_order=None, allow_fetch=False, dotall=False, raw_pattern=False)

    def document(self, schema: dict[str, Any]) -> dict[str, Any]:
        """A copy of `schema` made the document its local `$ref`s point into; embed this copy in `visit`."""
        doc = copy.deepcopy(schema)
        self._converter.resolve_refs(doc, "")
        return doc

    def visit(self, name: str, schema: dict[str, Any]) -> str:
        """Add the rules for `schema` (refs resolved against the last `document`) and return the rule name."""
        return str(self._converter.visit(schema, name))

    def schema(self, name: str, schema: dict[str, Any]) -> str:
        """Add the rules for a self-contained schema (its own `$defs`) and return the rule name."""
        return self.visit(name, self.document(schema))

    def rule(self, name: str, body: str) -> str:
        """Add a rule and return its (possibly escaped) name."""
        return str(self._converter.add_rule(name, body))

    def alternatives(self, name: str, rules: Sequence[str]) -> str:
        """Add a rule matching any of `rules`."""
        return self.rule(name, " | ".join(rules))

    def text(self) -> str:
        """The grammar so far."""
        return str(self._converter.format_grammar())
