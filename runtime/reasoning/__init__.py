"""Reasoning ("thinking") models: their syntaxes as data, the split of a reply into reasoning and answer
(whole and streamed), the budget, and the controls (`reasoning`, `reasoning_budget`, `chat_template_kwargs`).

Pure Python; imports nothing from the rest of the runtime, so every layer (loop, slot, serve) may use it.
"""

from runtime.reasoning.budget import Budget, BudgetSpec, BudgetState, utf8_complete
from runtime.reasoning.formats import FORMATS, ReasoningFormat, by_name, detect, with_template
from runtime.reasoning.options import REASONING_FIELDS, REASONING_MODES, ReasoningOptions
from runtime.reasoning.split import Reasoning, Split, Splitter, join, split

__all__ = [
    "FORMATS",
    "REASONING_FIELDS",
    "REASONING_MODES",
    "Budget",
    "BudgetSpec",
    "BudgetState",
    "Reasoning",
    "ReasoningFormat",
    "ReasoningOptions",
    "Split",
    "Splitter",
    "by_name",
    "detect",
    "join",
    "split",
    "utf8_complete",
    "with_template",
]
