"""Tool calls: tool definitions (`Tool`, `ToolChoice`), argument validation, and the tool-call formats
(prompt rendering, grammar, parser) for the chat templates turnstile meets. Knows nothing of the slot.
"""

from runtime.tools.calls import (
    ParsedReply,
    PartialCall,
    PartialReply,
    call_id,
    canonical_arguments,
    new_call_id,
    reply_seed,
)
from runtime.tools.formats import (
    GenericFormat,
    HermesFormat,
    Llama3Format,
    RenderPlan,
    SyntaxFormat,
    ToolFormat,
    detect_format,
    template_uses_tools,
)
from runtime.tools.grammar import ToolGrammar
from runtime.tools.plan import ToolPlan, result_text
from runtime.tools.spec import Tool, ToolChoice, as_tools, resolve_tool_choice
from runtime.tools.syntax import FAMILIES, ToolSyntax, detect_syntax
from sessions.model import ToolCall

__all__ = [
    "FAMILIES",
    "GenericFormat",
    "HermesFormat",
    "Llama3Format",
    "ParsedReply",
    "PartialCall",
    "PartialReply",
    "RenderPlan",
    "SyntaxFormat",
    "Tool",
    "ToolCall",
    "ToolChoice",
    "ToolFormat",
    "ToolGrammar",
    "ToolPlan",
    "ToolSyntax",
    "as_tools",
    "call_id",
    "canonical_arguments",
    "detect_format",
    "detect_syntax",
    "new_call_id",
    "reply_seed",
    "resolve_tool_choice",
    "result_text",
    "template_uses_tools",
]
