"""Grammars for constrained decoding.

- `json_schema_to_grammar` / `SchemaConverter`: JSON schema -> GBNF exactly as llama.cpp builds it.
- `chat_response_grammar`: the grammar llama-server's /v1/chat/completions uses for response_format.
- `schema_for`: a response format (type, schema dict, "json") -> its schema and the reply's parser.
"""

from runtime.grammar.chat import CHATML_GENERATION_PROMPT, chat_response_grammar, reply_content
from runtime.grammar.json_schema import SchemaConverter, json_schema_to_grammar
from runtime.grammar.response_format import JSON_OBJECT_SCHEMA, ResponseFormat, schema_for
from runtime.grammar.validate import validate

__all__ = [
    "CHATML_GENERATION_PROMPT",
    "JSON_OBJECT_SCHEMA",
    "ResponseFormat",
    "SchemaConverter",
    "chat_response_grammar",
    "json_schema_to_grammar",
    "reply_content",
    "schema_for",
    "validate",
]
