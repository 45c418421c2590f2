"""The Hermes / Qwen tool-call syntax: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`.

Used by templates that render `tools` themselves and contain `<tool_call>` (Qwen 2.5, Qwen 3, Hermes 2
Pro / Hermes 3, SmolLM3 ...). The family's data is `runtime.tools.families.HERMES`; this class is the
`SyntaxFormat` for it, kept by name for the callers that construct it directly. With `tool_choice="auto"`
the grammar is lazy, triggered by the word `<tool_call>` (text before it is free); `required` or a tool
name make it apply from the first token.
"""

from __future__ import annotations

from typing import Any

from runtime.tools.families import HERMES, ToolSyntax
from runtime.tools.syntax import SyntaxFormat

__all__ = ["HermesFormat"]


class HermesFormat(SyntaxFormat):
    """`<tool_call>` JSON `</tool_call>` blocks after optional text."""

    def __init__(
        self,
        syntax: ToolSyntax = HERMES,
        *,
        args_string: bool = False,
        reasoning: tuple[str, str] | None = None,
        inside: bool = False,
        kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(syntax, args_string=args_string, reasoning=reasoning, inside=inside, kwargs=kwargs)
