"""Tiny GGUF models with random weights, written by the tests themselves.

Each model has a ~500-token SentencePiece ("llama") vocabulary with byte fallback, the ChatML control
tokens and a ChatML `tokenizer.chat_template`, so it loads, renders chats and generates like a real
chat model, only nonsense. Files are well under 1.1 MB and load in milliseconds.

Architectures: `llama` (transformer), `mamba` (recurrent), `jamba` (hybrid: attention + Mamba layers),
`gemma3` (sliding-window attention).
"""

from __future__ import annotations

import string
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

N_EMBD = 64
N_VOCAB_TARGET = 512

_WORDS = [
    "the",
    "a",
    "an",
    "and",
    "or",
    "but",
    "of",
    "to",
    "in",
    "on",
    "at",
    "for",
    "with",
    "is",
    "are",
    "was",
    "be",
    "it",
    "this",
    "that",
    "you",
    "i",
    "we",
    "they",
    "he",
    "she",
    "hello",
    "world",
    "user",
    "assistant",
    "system",
    "yes",
    "no",
    "what",
    "why",
    "how",
    "when",
    "where",
    "who",
    "tell",
    "me",
    "more",
    "about",
    "story",
    "cat",
    "dog",
    "tree",
    "sun",
    "moon",
    "star",
    "sea",
    "ship",
    "code",
    "test",
    "model",
    "token",
    "cache",
    "state",
    "slot",
    "turn",
    "agent",
    "talk",
    "good",
    "bad",
    "new",
    "old",
    "big",
    "small",
    "red",
    "blue",
    "green",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "please",
    "thanks",
    "sure",
    "okay",
    "maybe",
    "think",
    "know",
    "say",
    "ask",
    "answer",
    "question",
    "idea",
    "plan",
    "make",
    "take",
    "give",
]


def _vocab() -> tuple[list[bytes], list[float], list[int]]:
    """Tokens, scores and types of a small SPM vocabulary with unique strings."""
    normal, unknown, control, byte = (
        gguf.TokenType.NORMAL,
        gguf.TokenType.UNKNOWN,
        gguf.TokenType.CONTROL,
        gguf.TokenType.BYTE,
    )
    toks: list[tuple[str, float, int]] = [
        ("<unk>", 0.0, unknown),
        ("<s>", 0.0, control),
        ("</s>", 0.0, control),
        ("<|im_start|>", 0.0, control),
        ("<|im_end|>", 0.0, control),
    ]
    toks += [(f"<0x{b:02X}>", 0.0, byte) for b in range(256)]
    pieces: list[str] = ["▁"]
    pieces += list(string.ascii_letters + string.digits + ".,!?;:'\"-()")
    pieces += ["▁" + c for c in string.ascii_lowercase]
    pieces += ["▁" + w for w in _WORDS]
    pieces += [w for w in _WORDS if len(w) > 1]
    for a in "etaoinshrdlu":
        for b in "etaoinshrdlu":
            pieces.append(a + b)
    seen = {t[0] for t in toks}
    for i, p in enumerate(pieces):
        if p in seen:
            continue
        seen.add(p)
        # longer pieces score higher so the SPM merges prefer them
        toks.append((p, -float(i) / 1000.0 + len(p), normal))
        if len(toks) >= N_VOCAB_TARGET:
            break
    return [t[0].encode() for t in toks], [t[1] for t in toks], [int(t[2]) for t in toks]


@dataclass(frozen=True)
class Vocab:
    """A model's tokenizer: token strings, scores and types, its BOS/EOS ids and chat template."""

    tokens: list[bytes]
    scores: list[float]
    types: list[int]
    bos: int
    eos: int
    template: str
    space_prefix: bool | None = None  # None: the tokenizer's default


def chatml_vocab() -> Vocab:
    """The default: the small SPM vocabulary, ChatML's control tokens and template."""
    tokens, scores, types = _vocab()
    return Vocab(tokens, scores, types, bos=1, eos=4, template=CHATML_TEMPLATE)  # eos <|im_end|>: ends a turn


def _header(w: gguf.GGUFWriter, vocab: Vocab, n_layer: int, n_ctx: int) -> None:
    w.add_context_length(n_ctx)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(n_layer)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list(vocab.tokens)
    w.add_token_scores(vocab.scores)
    w.add_token_types(vocab.types)
    w.add_bos_token_id(vocab.bos)
    w.add_eos_token_id(vocab.eos)
    w.add_unk_token_id(0)
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)
    if vocab.space_prefix is not None:
        w.add_add_space_prefix(vocab.space_prefix)
    w.add_chat_template(vocab.template)


class _Tensors:
    def __init__(self, w: gguf.GGUFWriter, seed: int) -> None:
        self.w = w
        self.rng = np.random.default_rng(seed)

    def add(self, name: str, *ne: int, scale: float = 0.3, value: float | None = None) -> None:
        """Add a tensor with ggml shape `ne` (numpy shape is reversed)."""
        shape = tuple(reversed(ne))
        if value is not None:
            data = np.full(shape, value, dtype=np.float32)
        else:
            data = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        self.w.add_tensor(name, data)

    def norm(self, name: str, n: int) -> None:
        self.add(name, n, value=1.0)


def _attention(t: _Tensors, i: int, n_head: int, n_head_kv: int, head_dim: int) -> None:
    n_q, n_kv = n_head * head_dim, n_head_kv * head_dim
    t.add(f"blk.{i}.attn_q.weight", N_EMBD, n_q)
    t.add(f"blk.{i}.attn_k.weight", N_EMBD, n_kv)
    t.add(f"blk.{i}.attn_v.weight", N_EMBD, n_kv)
    t.add(f"blk.{i}.attn_output.weight", n_q, N_EMBD)


def _ffn(t: _Tensors, i: int, n_ff: int) -> None:
    t.norm(f"blk.{i}.ffn_norm.weight", N_EMBD)
    t.add(f"blk.{i}.ffn_gate.weight", N_EMBD, n_ff)
    t.add(f"blk.{i}.ffn_up.weight", N_EMBD, n_ff)
    t.add(f"blk.{i}.ffn_down.weight", n_ff, N_EMBD)


def _mamba_layer(t: _Tensors, i: int, d_inner: int, d_conv: int, d_state: int, dt_rank: int, norms: bool) -> None:
    t.add(f"blk.{i}.ssm_in.weight", N_EMBD, 2 * d_inner)
    t.add(f"blk.{i}.ssm_conv1d.weight", d_conv, d_inner)
    t.add(f"blk.{i}.ssm_conv1d.bias", d_inner, scale=0.1)
    t.add(f"blk.{i}.ssm_x.weight", d_inner, dt_rank + 2 * d_state)
    t.add(f"blk.{i}.ssm_dt.weight", dt_rank, d_inner)
    t.add(f"blk.{i}.ssm_dt.bias", d_inner, scale=0.1)
    # A = -exp(A_log): negative, so the state decays
    a = -np.tile(np.arange(1, d_state + 1, dtype=np.float32), (d_inner, 1))
    t.w.add_tensor(f"blk.{i}.ssm_a", a)
    t.add(f"blk.{i}.ssm_d", d_inner, value=1.0)
    t.add(f"blk.{i}.ssm_out.weight", d_inner, N_EMBD)
    if norms:
        t.norm(f"blk.{i}.ssm_dt_norm.weight", dt_rank)
        t.norm(f"blk.{i}.ssm_b_norm.weight", d_state)
        t.norm(f"blk.{i}.ssm_c_norm.weight", d_state)


def _ssm_keys(w: gguf.GGUFWriter, d_inner: int, d_conv: int, d_state: int, dt_rank: int) -> None:
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(d_state)
    w.add_ssm_time_step_rank(dt_rank)


def _write(
    path: Path,
    arch: str,
    body: Callable[[gguf.GGUFWriter, _Tensors, int], None],
    *,
    n_layer: int,
    n_ctx: int,
    seed: int,
    vocab: Vocab | None = None,
) -> Path:
    vocab = vocab or chatml_vocab()
    w = gguf.GGUFWriter(str(path), arch)
    _header(w, vocab, n_layer, n_ctx)
    n_vocab = len(vocab.tokens)
    t = _Tensors(w, seed)
    t.add("token_embd.weight", N_EMBD, n_vocab, scale=1.0)
    t.norm("output_norm.weight", N_EMBD)
    t.add("output.weight", N_EMBD, n_vocab, scale=0.5)
    body(w, t, n_vocab)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_llama(path: Path, *, n_ctx: int = 4096, seed: int = 1, vocab: Vocab | None = None, n_head: int = 4) -> Path:
    """A 2-layer llama transformer (`n_head` heads of 64 / n_head values, half as many KV heads); `vocab`
    None: `chatml_vocab()`. `n_head=2` gives heads of 32, which quantized KV caches (32-value blocks) need."""
    n_layer, n_head_kv, n_ff = 2, max(1, n_head // 2), 128

    def body(w: gguf.GGUFWriter, t: _Tensors, _: int) -> None:
        w.add_feed_forward_length(n_ff)
        w.add_head_count(n_head)
        w.add_head_count_kv(n_head_kv)
        w.add_rope_dimension_count(N_EMBD // n_head)
        w.add_rope_freq_base(10000.0)
        for i in range(n_layer):
            t.norm(f"blk.{i}.attn_norm.weight", N_EMBD)
            _attention(t, i, n_head, n_head_kv, N_EMBD // n_head)
            _ffn(t, i, n_ff)

    return _write(path, "llama", body, n_layer=n_layer, n_ctx=n_ctx, seed=seed, vocab=vocab)


def write_mamba(path: Path, *, n_ctx: int = 4096, seed: int = 2) -> Path:
    """A 2-layer Mamba (recurrent: its memory cannot drop a suffix)."""
    n_layer, d_inner, d_conv, d_state, dt_rank = 2, 2 * N_EMBD, 4, 16, 4

    def body(w: gguf.GGUFWriter, t: _Tensors, _: int) -> None:
        w.add_feed_forward_length(0)
        w.add_head_count(0)
        _ssm_keys(w, d_inner, d_conv, d_state, dt_rank)
        for i in range(n_layer):
            t.norm(f"blk.{i}.attn_norm.weight", N_EMBD)
            _mamba_layer(t, i, d_inner, d_conv, d_state, dt_rank, norms=False)

    return _write(path, "mamba", body, n_layer=n_layer, n_ctx=n_ctx, seed=seed)


def write_jamba(path: Path, *, n_ctx: int = 4096, seed: int = 3, vocab: Vocab | None = None) -> Path:
    """A 2-layer Jamba (hybrid): layer 0 Mamba, layer 1 attention (per-layer head_count_kv, 0 = Mamba);
    `vocab` None: `chatml_vocab()`."""
    n_layer, n_head, n_ff = 2, 4, 128
    d_inner, d_conv, d_state, dt_rank = 2 * N_EMBD, 4, 16, 4
    kv_heads = [0, 2]

    def body(w: gguf.GGUFWriter, t: _Tensors, _: int) -> None:
        w.add_feed_forward_length(n_ff)
        w.add_head_count(n_head)
        w.add_array("jamba.attention.head_count_kv", kv_heads)
        _ssm_keys(w, d_inner, d_conv, d_state, dt_rank)
        for i in range(n_layer):
            t.norm(f"blk.{i}.attn_norm.weight", N_EMBD)
            if kv_heads[i] == 0:
                _mamba_layer(t, i, d_inner, d_conv, d_state, dt_rank, norms=True)
            else:
                _attention(t, i, n_head, kv_heads[i], N_EMBD // n_head)
            _ffn(t, i, n_ff)

    return _write(path, "jamba", body, n_layer=n_layer, n_ctx=n_ctx, seed=seed, vocab=vocab)


def write_gemma3(path: Path, *, n_ctx: int = 4096, n_swa: int = 16, seed: int = 4) -> Path:
    """A 2-layer Gemma 3: layer 0 sliding-window attention (window `n_swa`), layer 1 full attention."""
    n_layer, n_head, n_head_kv, head_dim, n_ff = 2, 4, 2, 16, 128

    def body(w: gguf.GGUFWriter, t: _Tensors, _: int) -> None:
        w.add_feed_forward_length(n_ff)
        w.add_head_count(n_head)
        w.add_head_count_kv(n_head_kv)
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_rope_freq_base(10000.0)
        w.add_sliding_window(n_swa)
        w.add_uint32("gemma3.attention.sliding_window_pattern", 2)
        for i in range(n_layer):
            t.norm(f"blk.{i}.attn_norm.weight", N_EMBD)
            _attention(t, i, n_head, n_head_kv, head_dim)
            t.norm(f"blk.{i}.post_attention_norm.weight", N_EMBD)
            t.norm(f"blk.{i}.attn_k_norm.weight", head_dim)
            t.norm(f"blk.{i}.attn_q_norm.weight", head_dim)
            _ffn(t, i, n_ff)
            t.norm(f"blk.{i}.post_ffw_norm.weight", N_EMBD)

    return _write(path, "gemma3", body, n_layer=n_layer, n_ctx=n_ctx, seed=seed)


WRITERS: dict[str, Callable[..., Path]] = {
    "llama": write_llama,
    "mamba": write_mamba,
    "jamba": write_jamba,
    "gemma3": write_gemma3,
}

# what the engine must report for each tiny model
KINDS: dict[str, str] = {
    "llama": "transformer",
    "mamba": "recurrent",
    "jamba": "hybrid",
    "gemma3": "sliding_window",
}


def write_all(directory: Path) -> dict[str, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    return {arch: fn(directory / f"tiny-{arch}.gguf") for arch, fn in WRITERS.items()}
