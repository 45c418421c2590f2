"""A tiny GGUF whose greedy replies are fixed texts: one tool call, then, once a tool result is in the
prompt, one answer. For parity tests of tool turns against llama-server, where a random-weight model
never reaches a tool call inside llama-server's grammar (which admits free text before the call).

    path = write_tool_caller(tmp / "caller.gguf", call='{"name": "get_weather", "arguments": {...}}',
                             answer="It is sunny in Paris.")

How it decides, exactly and for any prompt:
- embeddings are one-hot (residual dimension i = token i), the FFN is zero, so the residual stream at a
  position is its token's one-hot plus what attention adds;
- attention head 0 has a constant query and a key only on `<tool_response>` (in rotary dimensions whose
  frequency is ~0, so positions do not matter): it attends ~entirely to a `<tool_response>` token when the
  prompt holds one and its value sets a "flag" dimension to ~1; with none, the flag is exactly 0;
- the output head is a bigram table (each token's successor) plus a bias from the flag, so after the
  generation prompt's last token (`\\n`) the model says `<tool_call>`, the call, `</tool_call>`,
  `<|im_end|>` without a tool result in the prompt, and the answer, `<|im_end|>` with one.

The call and the answer are single tokens (so a bigram can say them); the call token is
`\\n{call}\\n`, as Qwen 2.5 / Hermes write it between the tags. The chat template is Qwen 2.5's (from the
vendored llama.cpp tree). Every other text is spelled in bytes, so any prompt tokenizes.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from tests.support.vendor import vendored_template

__all__ = ["QWEN25_TEMPLATE_NAME", "finish_scripted_llama", "open_scripted_llama", "write_tool_caller"]

QWEN25_TEMPLATE_NAME = "Qwen-Qwen2.5-7B-Instruct.jinja"

_N_HEAD, _HEAD_DIM = 6, 64
_N_EMBD = _N_HEAD * _HEAD_DIM  # 384: room for the one-hot vocabulary and the flag
_N_FF = 64  # the FFN's width (its weights are zero)
_CHAIN, _NEWLINE_ANSWER, _FLAG_BIAS = 20.0, 15.0, 10.0  # logit weights (x sqrt(n_embd) after the norm)


def _tokens(call: str, answer: str, second: str | None) -> tuple[list[bytes], list[int], dict[str, int]]:
    control, user = int(gguf.TokenType.CONTROL), int(gguf.TokenType.USER_DEFINED)
    normal, byte = int(gguf.TokenType.NORMAL), int(gguf.TokenType.BYTE)
    toks: list[tuple[str, int]] = [("<unk>", int(gguf.TokenType.UNKNOWN))]
    toks += [("<|endoftext|>", control), ("<|im_start|>", control), ("<|im_end|>", control)]
    toks += [("<tool_call>", user), ("</tool_call>", user), ("<tool_response>", user), ("</tool_response>", user)]
    toks += [(f"<0x{b:02X}>", byte) for b in range(256)]
    toks += [("\n" + call + "\n", normal), (answer, normal)]
    if second is not None:
        toks.append((_second_text(second), normal))
    texts = [t for t, _ in toks]
    if len(set(texts)) != len(texts):
        raise ValueError("the call and the answer must differ from each other and from the special tokens")
    return [t.encode() for t in texts], [k for _, k in toks], {t: i for i, t in enumerate(texts)}


def _second_text(call: str) -> str:
    return "\n<tool_call>\n" + call + "\n</tool_call>"


def write_tool_caller(path: Path, *, call: str, answer: str, second_call: str | None = None, n_ctx: int = 4096) -> Path:
    """Write the model to `path` (see the module docstring); `call` is the JSON the call token holds.
    `second_call`: after the first call's `</tool_call>` the model makes a second call (one token,
    `\n<tool_call>\n{second_call}\n</tool_call>`) before `<|im_end|>`, whose logit comes second, so a
    grammar that ends the reply after one call gets `<|im_end|>` there."""
    tokens, types, ids = _tokens(call, answer, second_call)
    n_vocab = len(tokens)
    flag = n_vocab  # the residual dimension attention writes
    assert flag < _N_EMBD
    newline, eos = ids["<0x0A>"], ids["<|im_end|>"]
    w = open_scripted_llama(path, n_ctx=n_ctx, n_head=_N_HEAD, head_dim=_HEAD_DIM)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * n_vocab)
    w.add_token_types(types)
    w.add_bos_token_id(ids["<|endoftext|>"])
    w.add_eos_token_id(eos)
    w.add_unk_token_id(0)
    embd = np.zeros((n_vocab, _N_EMBD), np.float32)
    embd[np.arange(n_vocab), np.arange(n_vocab)] = 1.0
    qk_dim = _HEAD_DIM - 1  # the last rotary pair of head 0: frequency 1e30^(-62/64), no rotation
    wq = np.zeros((_N_EMBD, _N_EMBD), np.float32)
    wq[qk_dim, :n_vocab] = 1.0  # a constant query, whatever the token
    wk = np.zeros((_N_EMBD, _N_EMBD), np.float32)
    wk[qk_dim, ids["<tool_response>"]] = 1.0
    scale = float(np.sqrt(_N_EMBD))  # the attention norm scales a one-hot row to sqrt(n_embd)
    wv = np.zeros((_N_EMBD, _N_EMBD), np.float32)
    wv[0, ids["<tool_response>"]] = 1.0 / scale
    wo = np.zeros((_N_EMBD, _N_EMBD), np.float32)
    wo[flag, 0] = 1.0
    out = np.zeros((n_vocab, _N_EMBD), np.float32)
    call_tok, answer_tok = ids["\n" + call + "\n"], ids[answer]
    chain = [(newline, ids["<tool_call>"]), (ids["<tool_call>"], call_tok), (call_tok, ids["</tool_call>"])]
    chain += [(answer_tok, eos)]
    if second_call is None:
        chain.append((ids["</tool_call>"], eos))
    else:
        second_tok = ids[_second_text(second_call)]
        chain += [(ids["</tool_call>"], second_tok), (second_tok, eos)]
        out[eos, ids["</tool_call>"]] = _NEWLINE_ANSWER  # the runner-up: the end, when the grammar says so
    for prev, nxt in chain:
        out[nxt, prev] = _CHAIN
    out[answer_tok, newline] = _NEWLINE_ANSWER  # beaten by <tool_call> unless the flag adds its bias
    out[answer_tok, flag] = _FLAG_BIAS
    finish_scripted_llama(w, embd=embd, attn=(wq, wk, wv, wo), out=out)
    return path


def open_scripted_llama(path: Path, *, n_ctx: int, n_head: int, head_dim: int) -> gguf.GGUFWriter:
    """A GGUF writer at `path` with the hyperparameters of a scripted model: one llama block of `n_head`
    heads of `head_dim` (as many KV heads), an FFN of 64, rotary frequencies ~0 but the first pair's, F32.
    The caller adds its tokenizer, then `finish_scripted_llama` writes the rest."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_head * head_dim)
    w.add_block_count(1)
    w.add_feed_forward_length(_N_FF)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(1e30)  # every rotary frequency but the first pair's is ~0
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    return w


def finish_scripted_llama(
    w: gguf.GGUFWriter,
    *,
    embd: np.ndarray,
    attn: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    out: np.ndarray,
) -> None:
    """Add what every scripted model has after its tokenizer (no BOS, EOS or space prefix added, Qwen 2.5's
    template, norms of ones, a zero FFN) and its weights: the token embeddings `embd`, the attention's
    (q, k, v, output) matrices and the output head `out`; then write the file and close it.
    Each matrix is a ggml tensor of ne = (cols, rows): numpy shape (rows, cols), `y = W @ x`."""
    n_embd = embd.shape[1]
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(False)
    w.add_chat_template(vendored_template(QWEN25_TEMPLATE_NAME))
    w.add_tensor("token_embd.weight", embd.astype(np.float32))
    for norm in ("output_norm", "blk.0.attn_norm", "blk.0.ffn_norm"):
        w.add_tensor(f"{norm}.weight", np.ones(n_embd, np.float32))
    for name, data in zip(("q", "k", "v", "output"), attn, strict=True):
        w.add_tensor(f"blk.0.attn_{name}.weight", data.astype(np.float32))
    w.add_tensor("blk.0.ffn_gate.weight", np.zeros((_N_FF, n_embd), np.float32))
    w.add_tensor("blk.0.ffn_up.weight", np.zeros((_N_FF, n_embd), np.float32))
    w.add_tensor("blk.0.ffn_down.weight", np.zeros((n_embd, _N_FF), np.float32))
    w.add_tensor("output.weight", out.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
