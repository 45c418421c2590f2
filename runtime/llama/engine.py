"""The engine: the only module that talks to llama.cpp (through llama-cpp-python's C API).

It owns one model and one context and offers what the slot needs: chat rendering and tokenization,
batched evaluation with an abort hook, sampling, per-sequence state and memory operations. Defaults
match llama-server's where numerics depend on them (flash attention on, n_batch 2048, n_ubatch 512),
so greedy answers equal llama-server's on the same workload.
"""

from __future__ import annotations

import ctypes
import enum
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np

from caches.buffers import STATE_BUFFERS
from runtime.backend.protocol import GrammarSpec, RenderedChat
from runtime.config import KV_TYPES, EngineConfig
from runtime.errors import ContextOverflow, InvalidRequest, LlamaDecodeError, ModelLoadError
from runtime.llama.chat_template import ChatTemplate
from runtime.llama.host import fingerprint_file, physical_cores
from runtime.llama.sampler import Sampler
from runtime.log import get_logger
from runtime.templates.load import chat_template_source
from sessions import Sampling

log = get_logger(__name__)

SEQ = 0  # the slot's sequence


class MemoryKind(enum.StrEnum):
    """What the model's memory is, which decides how the slot can roll it back."""

    TRANSFORMER = "transformer"  # a KV cache: any suffix can be dropped
    RECURRENT = "recurrent"  # a state per sequence (Mamba, RWKV): no suffix can be dropped
    HYBRID = "hybrid"  # attention + recurrent layers (Jamba, Granite-H, LFM2 …)
    SLIDING_WINDOW = "sliding_window"  # SWA layers keep only the last n_swa positions (Gemma 3)


# llama.cpp logs go to structlog (warnings and errors only) instead of stderr.
_LOG_LOCK = threading.Lock()
_backend_ready = False


_errors = threading.local()  # llama.cpp's error lines while this thread loads a model (`_llama_errors`)


@llama_cpp.llama_log_callback  # type: ignore[untyped-decorator]
def _llama_log(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    if level in (3, 4):  # ggml: 1 debug, 2 info, 3 warn, 4 error, 5 continuation
        msg = text.decode("utf-8", "replace").rstrip()
        if msg:
            log.debug("llama.log", level="warn" if level == 3 else "error", message=msg)
            lines = getattr(_errors, "lines", None)
            if level == 4 and lines is not None:
                lines.append(msg)


def _llama_errors(reason: str) -> str:
    """`reason`, with what llama.cpp logged as errors on this thread since `_errors.lines` was set."""
    lines: list[str] = getattr(_errors, "lines", None) or []
    said = "; ".join(line.split(": ", 1)[-1] if line.startswith("llama_") else line for line in lines[-3:])
    return f"{reason}: {said}" if said else reason


def _init_backend() -> None:
    global _backend_ready
    with _LOG_LOCK:
        if not _backend_ready:
            llama_cpp.llama_log_set(_llama_log, ctypes.c_void_p(0))
            llama_cpp.llama_backend_init()
            _backend_ready = True


def _check_gguf(path: Path) -> None:
    if not path.exists():
        raise ModelLoadError(str(path), "no such file")
    if not path.is_file():
        raise ModelLoadError(str(path), "not a regular file")
    try:
        with path.open("rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ModelLoadError(str(path), f"unreadable ({e.strerror})") from e
    if magic != b"GGUF":
        raise ModelLoadError(str(path), "not a GGUF file (bad magic)")


class Engine:
    """One model, one context, one sequence (seq 0) used by the slot. Not thread-safe: one caller."""

    def __init__(self, path: str | os.PathLike[str], config: EngineConfig | None = None) -> None:
        self.path = Path(path)
        self.config = config or EngineConfig()
        _check_gguf(self.path)
        _init_backend()
        cfg = self.config
        self.gpu_offload = bool(llama_cpp.llama_supports_gpu_offload())
        if cfg.n_gpu_layers != 0 and not self.gpu_offload:
            log.warning(
                "engine.no_gpu_offload",
                n_gpu_layers=cfg.n_gpu_layers,
                reason="this llama.cpp build has no GPU backend: every layer runs on the CPU "
                "(build with CMAKE_ARGS=-DGGML_CUDA=on, docs/hardware.md)",
            )
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = cfg.n_gpu_layers
        mparams.use_mmap = cfg.use_mmap
        mparams.use_mlock = cfg.use_mlock
        _errors.lines = []
        try:
            self._load(cfg, mparams)
        finally:
            _errors.lines = None

    def _load(self, cfg: EngineConfig, mparams: Any) -> None:
        model = llama_cpp.llama_model_load_from_file(str(self.path).encode(), mparams)
        if not model:
            raise ModelLoadError(
                str(self.path), _llama_errors("llama.cpp could not load it (damaged or unsupported GGUF)")
            )
        self.model: Any = model
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = cfg.n_ctx
        cparams.n_batch = cfg.n_batch
        cparams.n_ubatch = min(cfg.n_ubatch, cfg.n_batch)
        cparams.n_seq_max = 1
        threads = cfg.n_threads or physical_cores()
        cparams.n_threads = threads
        cparams.n_threads_batch = cfg.n_threads_batch or threads
        cparams.flash_attn_type = (
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO
            if cfg.flash_attn == "auto"
            else llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
            if cfg.flash_attn
            else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        cparams.swa_full = cfg.swa_full
        cparams.type_k = KV_TYPES[cfg.type_k]
        cparams.type_v = KV_TYPES[cfg.type_v]
        cparams.no_perf = True
        self._abort_check: Callable[[], bool] | None = None
        self._abort_cb = llama_cpp.ggml_abort_callback(self._abort_trampoline)
        self._no_abort_cb = llama_cpp.ggml_abort_callback()  # NULL: llama.cpp calls nothing
        ctx = llama_cpp.llama_init_from_model(model, cparams)
        if not ctx:
            llama_cpp.llama_model_free(model)
            raise ModelLoadError(
                str(self.path),
                _llama_errors(
                    f"llama.cpp could not create a context for it (n_ctx={cfg.n_ctx}, "
                    f"cache types K {cfg.type_k} / V {cfg.type_v}, flash attention {cfg.flash_attn_name})"
                ),
            )
        self.ctx: Any = ctx
        self.n_threads = threads
        self.vocab: Any = llama_cpp.llama_model_get_vocab(model)
        self._is_eog: dict[int, bool] = {}
        self._piece_buf = threading.local()
        self.mem: Any = llama_cpp.llama_get_memory(ctx)
        self.n_ctx = int(llama_cpp.llama_n_ctx(ctx))
        self.n_batch = cfg.n_batch
        self.n_ubatch = int(cparams.n_ubatch)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self.vocab))
        self.n_swa = int(llama_cpp.llama_model_n_swa(model))
        self.kind = self._memory_kind()
        self.n_layer = int(llama_cpp.llama_model_n_layer(model))
        # llama.cpp offloads the repeating layers and then the output layer: n_layer + 1 in all
        wanted = self.n_layer + 1 if cfg.n_gpu_layers < 0 else min(cfg.n_gpu_layers, self.n_layer + 1)
        self.n_gpu_layers = wanted if self.gpu_offload else 0
        self.fingerprint = fingerprint_file(self.path)
        self.settings_key = cfg.settings_key()
        self._batch = llama_cpp.llama_batch_init(cfg.n_batch, 0, 1)
        for i in range(cfg.n_batch):  # every row is for the one sequence: set once, not per decode
            self._batch.n_seq_id[i] = 1
            self._batch.seq_id[i][0] = SEQ
        # the batch's arrays, read once (each attribute read builds a new ctypes pointer object)
        self._b_token, self._b_pos, self._b_logits = self._batch.token, self._batch.pos, self._batch.logits
        # llama_get_logits_ith returning the address as an int (a private function object: llama_cpp's own keeps
        # its POINTER(c_float) result type), and a float32 view per address seen (no view built per token)
        self._logits_addr: Any = llama_cpp.llama_cpp._lib["llama_get_logits_ith"]
        self._logits_addr.argtypes = [ctypes.c_void_p, ctypes.c_int32]
        self._logits_addr.restype = ctypes.c_void_p
        self._views: dict[int, np.ndarray[Any, np.dtype[np.float32]]] = {}
        self._pieces: dict[tuple[int, bool], bytes] = {}  # token_to_piece, memoised (the vocabulary is fixed)
        self._logits_type: Any = ctypes.c_float * self.n_vocab
        self._closed = False
        self.chat_template = self.meta("tokenizer.chat_template")
        eos, bos = self.eos_token, self.bos_token
        self.template = ChatTemplate(
            self.chat_template,
            eos=self.token_text(eos) if eos != -1 else "",
            bos=self.token_text(bos) if bos != -1 else "",
            tokenize=self.tokenize,
            model=str(self.path),
            tool_use=self.meta("tokenizer.chat_template.tool_use"),
            override=chat_template_source(cfg.chat_template) if cfg.chat_template is not None else None,
            add_bos=bool(llama_cpp.llama_vocab_get_add_bos(self.vocab)),
            add_eos=bool(llama_cpp.llama_vocab_get_add_eos(self.vocab)),
        )
        self._eog: list[int] | None = None
        log.info(
            "engine.loaded",
            path=str(self.path),
            kind=str(self.kind),
            n_ctx=self.n_ctx,
            n_threads=threads,
            n_vocab=self.n_vocab,
            n_swa=self.n_swa,
            n_gpu_layers=self.n_gpu_layers,
            type_k=cfg.type_k,
            type_v=cfg.type_v,
            flash_attn=cfg.flash_attn_name,
        )

    # --- what the model is -------------------------------------------------------------------------

    def _memory_kind(self) -> MemoryKind:
        if llama_cpp.llama_model_is_hybrid(self.model):
            return MemoryKind.HYBRID
        if llama_cpp.llama_model_is_recurrent(self.model):
            return MemoryKind.RECURRENT
        if self.n_swa > 0 and not self.config.swa_full:
            return MemoryKind.SLIDING_WINDOW
        return MemoryKind.TRANSFORMER

    @property
    def can_truncate(self) -> bool:
        """Whether any suffix of the memory can be dropped (a plain transformer KV cache)."""
        return self.kind is MemoryKind.TRANSFORMER

    @property
    def needs_checkpoints(self) -> bool:
        return not self.can_truncate

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(1 << 16)
        n = llama_cpp.llama_model_meta_val_str(self.model, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            llama_cpp.llama_model_meta_val_str(self.model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace")

    def token_text(self, token: int) -> str:
        return bytes(llama_cpp.llama_vocab_get_text(self.vocab, token) or b"").decode("utf-8", "replace")

    @property
    def eos_token(self) -> int:
        return int(llama_cpp.llama_vocab_eos(self.vocab))

    @property
    def bos_token(self) -> int:
        return int(llama_cpp.llama_vocab_bos(self.vocab))

    @property
    def add_bos(self) -> bool:
        return bool(llama_cpp.llama_vocab_get_add_bos(self.vocab))

    @property
    def add_eos(self) -> bool:
        return bool(llama_cpp.llama_vocab_get_add_eos(self.vocab))

    @property
    def add_sep(self) -> bool:
        return bool(llama_cpp.llama_vocab_get_add_sep(self.vocab))

    @property
    def sep_token(self) -> int:
        return int(llama_cpp.llama_vocab_sep(self.vocab))

    def fim_tokens(self) -> list[int]:
        """Fill-in-the-middle tokens: prefix, suffix, middle, repo, file separator (-1: none)."""
        v, lib = self.vocab, llama_cpp
        fns = [lib.llama_vocab_fim_pre, lib.llama_vocab_fim_suf, lib.llama_vocab_fim_mid]
        return [int(f(v)) for f in [*fns, lib.llama_vocab_fim_rep, lib.llama_vocab_fim_sep]]

    def is_eog(self, token: int) -> bool:
        """Whether `token` ends a generation (memoised per token: the decode loop asks for every one, and a call
        into llama.cpp right after a decode step costs ~15 us where the dict lookup costs well under one)."""
        eog = self._is_eog.get(token)
        if eog is None:
            eog = self._is_eog[token] = bool(llama_cpp.llama_vocab_is_eog(self.vocab, token))
        return eog

    def eog_tokens(self) -> list[int]:
        """Every end-of-generation token of the vocabulary (computed once)."""
        if self._eog is None:
            self._eog = [t for t in range(self.n_vocab) if self.is_eog(t)]
        return self._eog

    # --- text ----------------------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 16
        buf = (llama_cpp.llama_token * cap)()
        n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (llama_cpp.llama_token * cap)()
            n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        return list(buf[:n])

    def token_to_piece(self, token: int, *, special: bool = False) -> bytes:
        """The token's bytes (memoised per token: the decode loop asks for every generated token)."""
        key = (token, special)
        piece = self._pieces.get(key)
        if piece is None:
            piece = self._pieces[key] = self._token_to_piece(token, special)
        return piece

    def _token_to_piece(self, token: int, special: bool) -> bytes:
        buf = getattr(self._piece_buf, "buf", None)  # one buffer per thread, reused (a fresh one costs ~20 us)
        if buf is None:
            buf = self._piece_buf.buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.token_to_piece(t) for t in tokens).decode("utf-8", "replace")

    def render(self, messages: Sequence[dict[str, Any]], **options: Any) -> RenderedChat:
        """`self.template.render`: the chat rendered with the model's template and tokenized."""
        return self.template.render(messages, **options)

    # --- evaluation ----------------------------------------------------------------------------------

    def _abort_trampoline(self, _data: ctypes.c_void_p) -> bool:
        check = self._abort_check
        return bool(check and check())

    def set_abort(self, check: Callable[[], bool] | None) -> None:
        """A check llama.cpp calls between graph computations; True aborts the running decode.

        None uninstalls the callback: llama.cpp would otherwise call into Python for every graph node.
        """
        if (check is None) != (self._abort_check is None):
            cb = self._no_abort_cb if check is None else self._abort_cb
            llama_cpp.llama_set_abort_callback(self.ctx, cb, None)
        self._abort_check = check

    def decode(self, tokens: Sequence[int], pos: int, *, logits_last: bool = True, logits_all: bool = False) -> None:
        """Evaluate `tokens` at positions pos.. in one batch of at most n_batch tokens.

        `logits_all`: logits for every token (a speculative draft's verification reads output i for batch
        position i); else for the last one only when `logits_last`.
        Raises LlamaDecodeError (code 2 when aborted: the ubatches already processed stay in memory).
        """
        n = len(tokens)
        if n == 0:
            return
        if n > self.n_batch:
            raise InvalidRequest(f"batch of {n} tokens exceeds n_batch={self.n_batch}")
        if pos + n > self.n_ctx:
            raise ContextOverflow(pos + n, self.n_ctx)
        b = self._batch
        b.n_tokens = n
        token, position, logits = self._b_token, self._b_pos, self._b_logits  # (n_seq_id, seq_id: set in __init__)
        if n == 1:  # the decode loop's step
            token[0] = tokens[0]
            position[0] = pos
            logits[0] = logits_all or logits_last
        else:
            for i, t in enumerate(tokens):
                token[i] = t
                position[i] = pos + i
                logits[i] = logits_all
            if logits_last:
                logits[n - 1] = 1
        rc = int(llama_cpp.llama_decode(self.ctx, b))
        if rc != 0:
            raise LlamaDecodeError(rc)

    def argmax(self, idx: int = -1) -> int:
        """The token with the highest logit at output `idx` (-1: the last), read in place without a copy;
        -1 when that is not one token (the highest logit is tied or NaN) or there are no such logits."""
        addr = self._logits_addr(self.ctx, idx)
        if not addr:
            return -1
        logits = self._views.get(addr)
        if logits is None:  # a view of the n_vocab floats at this address (valid whenever llama.cpp returns it)
            if len(self._views) >= 4 * self.n_batch:
                self._views.clear()
            logits = self._views[addr] = np.frombuffer(self._logits_type.from_address(addr), dtype=np.float32)
        tok = int(logits.argmax())  # the first highest logit (the first NaN if there is one)
        top = logits[tok]
        if top != top:  # NaN
            return -1
        if tok + 1 < self.n_vocab:  # a tie after it: argmax of the rest (cheaper right after a decode than max)
            rest = logits[tok + 1 :]
            if rest[int(rest.argmax())] == top:
                return -1
        return tok

    def logits(self) -> np.ndarray[Any, np.dtype[np.float32]]:
        """A copy of the last evaluated token's logits."""
        ptr = llama_cpp.llama_get_logits_ith(self.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()

    def sampler(
        self, sampling: Sampling | None = None, grammar: GrammarSpec | None = None, **overrides: Any
    ) -> Sampler:
        """A sampler chain for `sampling` (llama-server's defaults) with `overrides` applied, and a grammar."""
        return Sampler(self, (sampling or Sampling()).with_overrides(**overrides), grammar)

    # --- state and memory ------------------------------------------------------------------------------

    @staticmethod
    def _flags(partial: bool) -> int:
        return llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY if partial else 0

    def state_size(self, *, partial: bool = False, seq: int = SEQ) -> int:
        return int(llama_cpp.llama_state_seq_get_size_ext(self.ctx, seq, self._flags(partial)))

    def state_get(self, *, partial: bool = False, seq: int = SEQ) -> memoryview:
        """The sequence's state (full, or PARTIAL_ONLY: the parts that cannot be rolled back).

        One copy: llama.cpp writes straight into a buffer from `STATE_BUFFERS` (uninitialised; the memory
        of a state nobody refers to any more when there is one, so no fresh pages to fault in), returned
        as a read-only byte view that keeps the buffer alive as long as the caller keeps it.
        """
        size = self.state_size(partial=partial, seq=seq)
        buf = STATE_BUFFERS.take(size)
        dst = np.frombuffer(buf, dtype=np.uint8).ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        n = int(llama_cpp.llama_state_seq_get_data_ext(self.ctx, dst, size, seq, self._flags(partial)))
        del dst
        if n != size:
            raise LlamaDecodeError(-2, f"state copy returned {n} of {size} bytes")
        return buf.toreadonly()

    def state_set(self, data: bytes | bytearray | memoryview, *, partial: bool = False, seq: int = SEQ) -> bool:
        """Load a state saved by `state_get`; False (memory cleared) when llama.cpp refuses it.

        No copy on our side: llama.cpp reads `data` in place (any contiguous byte buffer).
        """
        arr = np.frombuffer(data, dtype=np.uint8)
        src = arr.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        n = int(llama_cpp.llama_state_seq_set_data_ext(self.ctx, src, arr.size, seq, self._flags(partial)))
        if n != arr.size:
            if not partial:
                self.clear()
            return False
        return True

    def seq_rm(self, p0: int, p1: int = -1, *, seq: int = SEQ) -> bool:
        """Remove positions [p0, p1) of the sequence; False if the memory cannot (recurrent suffix)."""
        return bool(llama_cpp.llama_memory_seq_rm(self.mem, seq, p0, p1))

    def pos_min(self, seq: int = SEQ) -> int:
        return int(llama_cpp.llama_memory_seq_pos_min(self.mem, seq))

    def pos_max(self, seq: int = SEQ) -> int:
        return int(llama_cpp.llama_memory_seq_pos_max(self.mem, seq))

    def clear(self) -> None:
        llama_cpp.llama_memory_clear(self.mem, True)

    # --- lifetime --------------------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        llama_cpp.llama_batch_free(self._batch)
        llama_cpp.llama_free(self.ctx)
        llama_cpp.llama_model_free(self.model)
        log.debug("engine.closed", path=str(self.path))

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
