"""Embeddings from a second llama.cpp context on the chat engine's weights (llama-server's `--embedding`).

`Embedder(engine, pooling)` creates, on first use, a context with `embeddings = true` on the engine's own model
(the weights are shared, nothing is loaded twice) and keeps it; the chat slot's context, its memory and its
tokens are never touched. Each input is evaluated alone in sequence 0 (the memory cleared first), as one
batch, every token an output, as llama-server's embedding slots do; pooled models give one vector per input
(`llama_get_embeddings_seq`), `pooling="none"` one per token (`llama_get_embeddings_ith`). `normalize` is
llama.cpp's `common_embd_normalize`: -1 none, 0 max-abs scaled to int16, 1 taxicab, 2 euclidean, >2 p-norm.

Runs in the slot's worker thread (the Runtime hands it there), so it shares the CPU with the slot's decodes
in turn, never at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import llama_cpp
import numpy as np

from runtime.errors import ContextOverflow, InvalidRequest, LlamaDecodeError
from runtime.log import get_logger

__all__ = ["POOLING", "Embedder", "Pooling", "normalize"]

log = get_logger(__name__)

Pooling = Literal["none", "mean", "cls", "last", "rank"]
POOLING: dict[str, int] = {
    "none": llama_cpp.LLAMA_POOLING_TYPE_NONE,
    "mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN,
    "cls": llama_cpp.LLAMA_POOLING_TYPE_CLS,
    "last": llama_cpp.LLAMA_POOLING_TYPE_LAST,
    "rank": llama_cpp.LLAMA_POOLING_TYPE_RANK,
}


def normalize(vec: np.ndarray[Any, np.dtype[np.float32]], how: int) -> list[float]:
    """llama.cpp's common_embd_normalize (in double precision, as it sums)."""
    v = vec.astype(np.float64)
    if how < 0:
        s = 1.0
    elif how == 0:
        s = float(np.max(np.abs(v))) / 32760.0 if len(v) else 0.0
    elif how == 1:
        s = float(np.sum(np.abs(v)))
    elif how == 2:
        s = float(np.sqrt(np.sum(v * v)))
    else:
        s = float(np.sum(np.abs(v) ** how) ** (1.0 / how))
    norm = 1.0 / s if s > 0.0 else 0.0
    return [float(x) for x in (v * norm).astype(np.float32)]


class Embedder:
    """A second context for embeddings on an engine's model; created on the first `embed`."""

    def __init__(self, engine: Any, pooling: Pooling | None = None) -> None:
        self.engine = engine
        self.pooling = pooling  # None: the model's own (llama.cpp's default for its architecture)
        self.ctx: Any = None
        self.n_ctx = engine.n_ctx
        self.n_embd = int(llama_cpp.llama_model_n_embd(engine.model))
        self._batch: Any = None

    def _open(self) -> None:
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = self.n_ctx
        cparams.n_batch = self.n_ctx  # one input is one batch (non-causal models need all of it at once)
        cparams.n_ubatch = self.n_ctx
        cparams.n_seq_max = 1
        cparams.n_threads = self.engine.n_threads
        cparams.n_threads_batch = self.engine.n_threads
        cparams.embeddings = True
        cparams.no_perf = True
        if self.pooling is not None:
            cparams.pooling_type = POOLING[self.pooling]
        ctx = llama_cpp.llama_init_from_model(self.engine.model, cparams)
        if not ctx:
            raise InvalidRequest("llama.cpp could not create an embedding context for this model")
        self.ctx = ctx
        self._batch = llama_cpp.llama_batch_init(self.n_ctx, 0, 1)
        log.info("embedder.opened", n_ctx=self.n_ctx, pooling=self.pooling_name)

    @property
    def pooling_name(self) -> str:
        if self.ctx is None:
            return self.pooling or "model"
        kind = int(llama_cpp.llama_pooling_type(self.ctx))
        return next((k for k, v in POOLING.items() if v == kind), str(kind))

    def pooled(self) -> bool:
        if self.ctx is None:
            self._open()
        return int(llama_cpp.llama_pooling_type(self.ctx)) != llama_cpp.LLAMA_POOLING_TYPE_NONE

    def embed(self, tokens: Sequence[int], how: int = 2) -> list[list[float]]:
        """One input's embedding: [one vector] when pooled (normalized by `how`), else one per token (raw)."""
        self._evaluate(tokens)
        ctx, n = self.ctx, len(tokens)
        if self.pooled():
            return [normalize(self._vector(llama_cpp.llama_get_embeddings_seq(ctx, 0)), how)]
        return [[float(x) for x in self._vector(llama_cpp.llama_get_embeddings_ith(ctx, i))] for i in range(n)]

    def score(self, tokens: Sequence[int]) -> float:
        """A rerank score: the first value of the pooled output (llama-server's send_rerank; `rank` pooling)."""
        self._evaluate(tokens)
        ptr = llama_cpp.llama_get_embeddings_seq(self.ctx, 0)
        if not ptr:
            ptr = llama_cpp.llama_get_embeddings_ith(self.ctx, len(tokens) - 1)
        return float(ptr[0]) if ptr else -1e6

    def _evaluate(self, tokens: Sequence[int]) -> None:
        if self.ctx is None:
            self._open()
        n = len(tokens)
        if n == 0:
            raise InvalidRequest("Input content cannot be empty")
        if n > self.n_ctx:
            raise ContextOverflow(n, self.n_ctx)
        ctx, b = self.ctx, self._batch
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
        for i, t in enumerate(tokens):
            b.token[i] = t
            b.pos[i] = i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = 1
        b.n_tokens = n
        encoder = bool(llama_cpp.llama_model_has_encoder(self.engine.model))
        rc = llama_cpp.llama_encode(ctx, b) if encoder else llama_cpp.llama_decode(ctx, b)
        if rc != 0:
            raise LlamaDecodeError(int(rc))

    def _vector(self, ptr: Any) -> np.ndarray[Any, np.dtype[np.float32]]:
        if not ptr:
            raise LlamaDecodeError(-1, "llama.cpp gave no embedding")
        return np.array(ptr[: self.n_embd], dtype=np.float32)

    def close(self) -> None:
        if self.ctx is not None:
            llama_cpp.llama_batch_free(self._batch)
            llama_cpp.llama_free(self.ctx)
            self.ctx = None
