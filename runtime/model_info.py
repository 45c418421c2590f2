"""What a Runtime's model is, for llama-server's /props and /v1/models (`Runtime.model_info()`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ModelInfo", "model_info"]


@dataclass(frozen=True)
class ModelInfo:
    name: str
    path: str  # the GGUF file ("" for a backend without one)
    n_ctx: int
    n_vocab: int
    n_ctx_train: int
    chat_template: str
    chat_template_tool_use: str | None
    bos_token: str
    eos_token: str
    # fill-in-the-middle tokens (-1: the model has none), BOS and whether the tokenizer adds it, for /infill
    fim: tuple[int, int, int, int, int] = (-1, -1, -1, -1, -1)  # prefix, suffix, middle, repo, file separator
    bos_id: int = -1
    add_bos: bool = False
    n_batch: int = 2048
    # for /rerank's prompt (llama-server's format_prompt_rerank): the model's rerank template, EOS (or SEP), SEP
    rerank_template: str | None = None
    eos_id: int = -1
    sep_id: int = -1
    add_eos: bool = False
    add_sep: bool = False
    eog_tokens: tuple[int, ...] = ()  # the end-of-generation token ids (what ignore_eos bans)


def model_info(backend: Any) -> ModelInfo:
    """The info of a backend: a llama.cpp one (its engine and template), or any other (defaults)."""
    engine = getattr(backend, "engine", None)
    template = getattr(engine, "template", None)
    sources = getattr(template, "sources", None)
    tool_use = sources.for_tools(True) if sources is not None else None
    default = getattr(template, "source", "") or ""
    train = engine.meta(f"{engine.meta('general.architecture')}.context_length") if engine is not None else None
    return ModelInfo(
        name=str(backend.name),
        path=str(getattr(engine, "path", "")),
        n_ctx=int(backend.n_ctx),
        n_vocab=int(getattr(engine, "n_vocab", 0)),
        n_ctx_train=int(train) if train and train.isdigit() else int(backend.n_ctx),
        chat_template=default,
        chat_template_tool_use=tool_use if tool_use and tool_use != default else None,
        bos_token=engine.token_text(engine.bos_token) if engine is not None and engine.bos_token != -1 else "",
        eos_token=engine.token_text(engine.eos_token) if engine is not None and engine.eos_token != -1 else "",
        **(_vocab_info(engine) if engine is not None else {}),
        eog_tokens=tuple(engine.eog_tokens()) if engine is not None else (),
    )


def _vocab_info(engine: Any) -> dict[str, Any]:
    return {
        "fim": tuple(engine.fim_tokens()),
        "bos_id": int(engine.bos_token),
        "add_bos": bool(engine.add_bos),
        "n_batch": int(engine.n_batch),
        "rerank_template": engine.meta("tokenizer.chat_template.rerank"),
        "eos_id": int(engine.eos_token),
        "sep_id": int(engine.sep_token),
        "add_eos": bool(engine.add_eos),
        "add_sep": bool(engine.add_sep),
    }
