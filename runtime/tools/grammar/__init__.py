"""GBNF for tool calls: `ToolGrammar` and the builder over llama.cpp's JSON-schema converter (`builder.py`),
the rule for one call shape by shape (`calls.py`) and the calls part of a reply with its triggers
(`syntax.py`). Formats that are not a `ToolSyntax` (Llama 3.x, generic) build theirs with the builder.
"""

from runtime.tools.grammar.builder import GrammarBuilder, ToolGrammar, gbnf_literal
from runtime.tools.grammar.syntax import syntax_grammar, trigger_pattern

__all__ = ["GrammarBuilder", "ToolGrammar", "gbnf_literal", "syntax_grammar", "trigger_pattern"]
