"""The reasoning controls of a turn, as llama-server has them, and how they resolve.

- `reasoning`: "auto" (the template's default), "on", "off" (llama-server's `--reasoning`): off sets the
  template's switch (`enable_thinking=False`) and, when the generation prompt opens the block anyway,
  closes it at once (a budget of 0: the closer is forced as the first tokens).
- `reasoning_budget`: tokens inside the block (None: no limit; 0: close at once), then
  `reasoning_budget_message` + the closer are forced (`runtime.reasoning.budget`).
- `chat_template_kwargs`: any template variables, passed to rendering.
- `reasoning_format`: "auto" splits the reasoning from the answer, "none" keeps it in the answer's text.

They are set per Runtime (`Runtime.open`), per session and per request (the session's and the request's
values are `Sampling` fields, None meaning "inherit"); `resolve` gives the values of one turn. Every value
is checked by `check` (`InvalidSampling` for a session or request value, `InvalidConfig` for the Runtime's),
before anything is queued.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from runtime.reasoning.budget import BudgetSpec
from runtime.reasoning.formats import ReasoningFormat
from sessions.model import MAX_REASONING_BUDGET, REASONING_CONTROLS, reasoning_problem

__all__ = ["REASONING_FIELDS", "REASONING_FORMATS", "REASONING_MODES", "ReasoningOptions", "problem"]

ReasoningMode = Literal["auto", "on", "off"]
REASONING_MODES = ("auto", "on", "off")
REASONING_FORMATS = ("auto", "none")
REASONING_FIELDS = REASONING_CONTROLS


def problem(name: str, value: Any) -> str | None:
    """Why `value` is not a valid value of reasoning control `name` (None, "inherit", always is)."""
    return reasoning_problem(name, value)


@dataclass(frozen=True)
class ReasoningOptions:
    """The reasoning controls of one turn (or the Runtime's defaults)."""

    mode: ReasoningMode = "auto"
    budget: int | None = None
    budget_message: str = ""
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    keep: bool = False  # reasoning_format "none": the reasoning stays in the answer's text

    @classmethod
    def from_values(cls, values: Mapping[str, Any], base: ReasoningOptions | None = None) -> ReasoningOptions:
        """`base` with the non-None values of `values` (keyed by `REASONING_FIELDS`) applied; template
        variables are merged (the later ones win). `ValueError` with the reason for a bad value."""
        base = base if base is not None else cls()
        for name in REASONING_FIELDS:
            bad = problem(name, values.get(name))
            if bad is not None:
                raise ValueError(f"{name}: {bad}")
        kwargs = dict(base.template_kwargs)
        kwargs.update(values.get("chat_template_kwargs") or {})
        fmt = values.get("reasoning_format")
        mode: ReasoningMode = values.get("reasoning") or base.mode
        return cls(
            mode=mode,
            budget=values["reasoning_budget"] if values.get("reasoning_budget") is not None else base.budget,
            budget_message=values.get("reasoning_budget_message") or base.budget_message,
            template_kwargs=kwargs,
            keep=base.keep if fmt is None else fmt == "none",
        )

    def template_variables(self, fmt: ReasoningFormat | None) -> dict[str, Any]:
        """The variables to render with: the given ones, and the format's switch for "on" / "off"."""
        out = dict(self.template_kwargs)
        switch = fmt.switch if fmt is not None else "enable_thinking"
        if self.mode != "auto" and switch is not None:
            out.setdefault(switch, self.mode == "on")
        return out

    def budget_for(self, fmt: ReasoningFormat | None, inside: bool, *, track: bool = False) -> BudgetSpec | None:
        """The budget the slot enforces: "off" on an opened block closes it at once; else the budget; `track`
        (a lazy grammar): an unlimited one, so that the slot knows when it is inside the block."""
        if fmt is None:
            return None
        if self.mode == "off" and inside:
            return BudgetSpec(fmt.start, fmt.end, 0, "", inside=True)
        if self.budget is None:
            return BudgetSpec(fmt.start, fmt.end, MAX_REASONING_BUDGET, inside=inside) if track else None
        return BudgetSpec(fmt.start, fmt.end, self.budget, self.budget_message, inside=inside)
