"""`turnstile serve`'s reasoning flags, as llama-server's: `--reasoning on|off|auto`, `--reasoning-format
none|auto|deepseek` (`deepseek` splits as `auto` does), `--reasoning-budget N` (-1: no limit, 0: close the block at
once) and `--reasoning-budget-message TEXT`, turned into `Runtime.open`'s keywords (for one Runtime or each replica).
"""

from __future__ import annotations

import argparse
from typing import Any

from sessions.model import MAX_REASONING_BUDGET

__all__ = ["add_arguments", "check_arguments", "open_keywords"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--reasoning", choices=("on", "off", "auto"), default="auto", help="thinking on, off or the template's (auto)"
    )
    p.add_argument(
        "--reasoning-format",
        choices=("none", "auto", "deepseek"),
        default="auto",
        help="none: the reasoning stays in the content; auto / deepseek: it goes to reasoning_content (auto)",
    )
    p.add_argument(
        "--reasoning-budget", type=int, default=-1, metavar="N", help="thinking tokens (-1 no limit, 0 none; -1)"
    )
    p.add_argument(
        "--reasoning-budget-message", default=None, metavar="TEXT", help="written before the block is closed"
    )


def check_arguments(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if not -1 <= args.reasoning_budget <= MAX_REASONING_BUDGET:
        p.error(f"--reasoning-budget must be -1 (no limit), 0 or a number of tokens up to {MAX_REASONING_BUDGET}")


def open_keywords(args: argparse.Namespace) -> dict[str, Any]:
    """Runtime.open's reasoning keywords from the flags."""
    return {
        "reasoning": args.reasoning,
        "reasoning_format": "none" if args.reasoning_format == "none" else "auto",
        "reasoning_budget": None if args.reasoning_budget == -1 else args.reasoning_budget,
        "reasoning_budget_message": args.reasoning_budget_message,
    }
