"""turnstile's runtime: the Runtime facade over the scheduler, the slot executor and the llama.cpp engine.

Importing `runtime` loads nothing heavy: the names below are imported on first use (PEP 562), so
`runtime.tools`, `runtime.serve.cluster.affinity` or `turnstile --help` never load llama.cpp.

Packages, in dependency order (a test over the import graph keeps them so):
- `runtime.errors`, `runtime.log`, `runtime.types`, `runtime.reply`: names every package may use;
- `runtime.grammar`, `runtime.tools`, `runtime.reasoning`: grammars, tool-call formats and reasoning syntaxes
  (the split, the budget, the controls), pure data and functions;
- `runtime.backend`: the `SlotBackend` protocol and what crosses it (`runtime.backend.llama` is the real one);
- `runtime.loop`: the event-loop side (scheduler, policies, turns, streams, constraints, context, the agent
  loop); it never imports llama.cpp or the slot;
- `runtime.llama`: the only importer of `llama_cpp` (engine, sampler, chat templating, host facts, models);
- `runtime.slot`: the slot executor in the worker thread (prefix reuse, checkpoints, stops, detokenizing);
- `runtime.api`: the `Runtime`; `runtime.serve`, `runtime.cli`, `runtime.testing` on top.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runtime.api import Runtime, RuntimeStats
    from runtime.config import RuntimeConfig
    from runtime.errors import (
        BadInput,
        ContextOverflow,
        InvalidConfig,
        InvalidRequest,
        LlamaDecodeError,
        ModelLoadError,
        QueueFull,
        RequestTimeout,
        RuntimeClosed,
        TurnstileError,
    )
    from runtime.log import configure_logging
    from runtime.loop.options import SamplingOptions, TurnOptions
    from runtime.reasoning import Reasoning
    from runtime.reply import Reply, Timings, ToolCallDelta, Usage

_EXPORTS = {
    "Runtime": "runtime.api",
    "RuntimeStats": "runtime.api",
    "RuntimeConfig": "runtime.config",
    "SamplingOptions": "runtime.loop.options",
    "TurnOptions": "runtime.loop.options",
    "BadInput": "runtime.errors",
    "ContextOverflow": "runtime.errors",
    "InvalidConfig": "runtime.errors",
    "InvalidRequest": "runtime.errors",
    "LlamaDecodeError": "runtime.errors",
    "ModelLoadError": "runtime.errors",
    "QueueFull": "runtime.errors",
    "RequestTimeout": "runtime.errors",
    "RuntimeClosed": "runtime.errors",
    "TurnstileError": "runtime.errors",
    "configure_logging": "runtime.log",
    "Reasoning": "runtime.reasoning",
    "Reply": "runtime.reply",
    "Timings": "runtime.reply",
    "ToolCallDelta": "runtime.reply",
    "Usage": "runtime.reply",
}

__all__ = [
    "BadInput",
    "ContextOverflow",
    "InvalidConfig",
    "InvalidRequest",
    "LlamaDecodeError",
    "ModelLoadError",
    "QueueFull",
    "Reasoning",
    "Reply",
    "RequestTimeout",
    "Runtime",
    "RuntimeClosed",
    "RuntimeConfig",
    "RuntimeStats",
    "SamplingOptions",
    "Timings",
    "ToolCallDelta",
    "TurnOptions",
    "TurnstileError",
    "Usage",
    "configure_logging",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
