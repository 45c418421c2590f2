"""A tiny hybrid (Jamba-style) thinking model: Qwen3's real chat template on `tiny_models.write_jamba`'s weights.

The vocabulary has Qwen's control tokens (`<|endoftext|>`, `<|im_start|>`, `<|im_end|>`, the last one EOS),
`<think>` and `</think>` as USER_DEFINED tokens (they detokenize to their text, as in Qwen3's tokenizer), byte
fallback and word pieces; every token string is unique and no space prefix is added (like Qwen's BPE). The
template is read from the vendored llama.cpp tree at run time (`tests.support.vendor`, never copied into
the repository). Used by tests/reasoning/test_hybrid_thinking.py and `python -m benchmarks thinking`.
"""

from __future__ import annotations

import string
from pathlib import Path

import gguf

from tests.support.tiny_models import _WORDS, Vocab, write_jamba
from tests.support.vendor import vendored_template

__all__ = ["QWEN3_TEMPLATE_NAME", "forced_thought", "qwen3_template", "thinking_vocab", "write_hybrid_thinking"]

QWEN3_TEMPLATE_NAME = "Qwen-Qwen3-0.6B.jinja"

_CONTROL, _USER = int(gguf.TokenType.CONTROL), int(gguf.TokenType.USER_DEFINED)
_SPECIALS = [
    ("<|endoftext|>", _CONTROL),
    ("<|im_start|>", _CONTROL),
    ("<|im_end|>", _CONTROL),
    ("<think>", _USER),
    ("</think>", _USER),
]


def qwen3_template() -> str:
    """Qwen3's chat template, verbatim (llama.cpp's models/templates/Qwen-Qwen3-0.6B.jinja)."""
    return vendored_template(QWEN3_TEMPLATE_NAME)


def thinking_vocab(template: str) -> Vocab:
    """The vocabulary described in the module docstring, with `template` as the GGUF's chat template."""
    normal, byte = int(gguf.TokenType.NORMAL), int(gguf.TokenType.BYTE)
    toks: list[tuple[str, float, int]] = [("<unk>", 0.0, int(gguf.TokenType.UNKNOWN))]
    toks += [(s, 0.0, t) for s, t in _SPECIALS]
    toks += [(f"<0x{b:02X}>", 0.0, byte) for b in range(256)]
    pieces = ["▁", *string.ascii_letters, *string.digits, *".,!?;:'\"-(){}[]_<>/|#="]
    pieces += ["▁" + w for w in _WORDS] + [w for w in _WORDS if len(w) > 1]
    seen = {t[0] for t in toks}
    for i, p in enumerate(pieces):
        if p not in seen:
            seen.add(p)
            toks.append((p, -float(i) / 1000.0 + len(p), normal))  # longer pieces win the SPM merges
    ids = {t[0]: i for i, t in enumerate(toks)}
    return Vocab(
        [t[0].encode() for t in toks],
        [t[1] for t in toks],
        [t[2] for t in toks],
        bos=ids["<|endoftext|>"],
        eos=ids["<|im_end|>"],
        template=template,
        space_prefix=False,
    )


def write_hybrid_thinking(path: Path, template: str | None = None, *, seed: int = 23) -> Path:
    """A tiny Jamba with `template` (None: Qwen3's) and `<think>` / `</think>` as single text tokens."""
    return write_jamba(path, seed=seed, vocab=thinking_vocab(template if template is not None else qwen3_template()))


def forced_thought(turn: int, *, free_answer: bool = False) -> str:
    """A raw GBNF grammar forcing one turn's output: a think block, then an answer.

    The thought is fixed by `turn`; so is the answer, unless `free_answer`: then it is any lowercase text
    (a letter, then up to 23 letters and spaces), so that the model's greedy choices decide it. A fixed answer's
    length grows with the turn so that consecutive turns differ. `<think>` and `</think>` are spelled as
    literals (the tiny vocabulary has them as single tokens).
    """
    head = f"<think>\\nstep {turn}: think about it\\n</think>\\n\\n"
    if free_answer:
        return f'root ::= "{head}" [a-z] [a-z ]{{0,23}}'
    answer = "the answer is " + " ".join(["yes"] * (1 + turn % 3)) + f" {turn}"
    return f'root ::= "{head}{answer}"'
