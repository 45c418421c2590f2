"""The sampler: a llama.cpp sampler chain in llama-server's order, built from `Sampling` settings, and
an optional grammar applied as llama-server applies it (`common_sampler_sample`, grammar_first false):
sample with the chain; if the grammar rejects the token, apply the grammar to all logits, then the chain,
and sample again. The grammar accepts only generated tokens; it may first be fed a prefill (llama-server's
generation prompt, for output-format and tool-call grammars).
"""

from __future__ import annotations

import ctypes
import math
from typing import Any, Protocol

import llama_cpp
import numpy as np

from runtime.backend.protocol import GrammarSpec
from runtime.errors import InvalidGrammar, InvalidRequest
from runtime.grammar.tokens import token_literals
from runtime.reply import Candidate
from sessions import Sampling


class Engine(Protocol):
    """What the sampler reads of an engine (`runtime.llama.engine.Engine`): its vocabulary and its logits."""

    vocab: Any  # the llama_vocab pointer
    ctx: Any  # the llama_context pointer
    n_vocab: int
    n_ctx: int

    def eog_tokens(self) -> list[int]: ...

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]: ...

    def token_to_piece(self, token: int, *, special: bool = ...) -> bytes: ...

    def argmax(self, idx: int = -1) -> int: ...


_DEFAULT_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: a random seed


_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])


def init_grammar(engine: Engine, spec: GrammarSpec) -> Any:
    """llama.cpp's grammar sampler for `spec`; InvalidRequest if llama.cpp cannot parse it."""
    gbnf = spec.gbnf.encode("utf-8")
    if spec.lazy:
        patterns = [p.encode("utf-8") for p in spec.trigger_patterns]
        c_patterns = (ctypes.c_char_p * max(1, len(patterns)))(*patterns)
        c_tokens = (llama_cpp.llama_token * max(1, len(spec.trigger_tokens)))(*spec.trigger_tokens)
        grammar = llama_cpp.llama_sampler_init_grammar_lazy_patterns(
            engine.vocab, gbnf, b"root", c_patterns, len(patterns), c_tokens, len(spec.trigger_tokens)
        )
    else:
        grammar = llama_cpp.llama_sampler_init_grammar(engine.vocab, gbnf, b"root")
    if not grammar:
        raise InvalidGrammar(
            "the grammar does not parse (llama.cpp's GBNF parser refused it; a token literal <...> must be one token)"
        )
    return grammar


def check_grammar(engine: Engine, spec: GrammarSpec) -> None:
    """Raise InvalidGrammar unless llama.cpp parses the grammar and can run it: a token literal naming an
    end-of-generation token (`<|call|>`, `<[id]>`) can never match, as llama.cpp's sampler lets such a token through
    only once the grammar is complete; the grammar would dead-end and llama.cpp abort (`runtime.grammar.tokens`).
    Read-only on the vocabulary: any thread."""
    llama_cpp.llama_sampler_free(init_grammar(engine, spec))
    eog = set(engine.eog_tokens())
    for lit in token_literals(spec.gbnf):
        if lit.token_id is not None:
            if not 0 <= lit.token_id < engine.n_vocab:
                raise InvalidGrammar(f"the grammar's token literal {lit.text} is not a token id of this model")
            ids = [lit.token_id]
        else:
            ids = engine.tokenize(lit.text, add_special=False, parse_special=True)
        if not lit.negated and len(ids) == 1 and ids[0] in eog:
            raise InvalidGrammar(
                f"the grammar's token literal {lit.text} is an end-of-generation token: llama.cpp's grammar never "
                f"matches one (the reply ends there); end the rule before it, or spell its text as a string literal"
            )


def _neutral(sp: Sampling) -> bool:
    """Whether the penalties change nothing (llama.cpp's penalties sampler then returns at once)."""
    return sp.repeat_penalty == 1.0 and not sp.presence_penalty and not sp.frequency_penalty


def _plain(sp: Sampling) -> bool:
    """Whether the chain is temperature, top-k, top-p and min-p only: no logit bias, no Mirostat, and every other
    sampler at its neutral value (each of llama.cpp's returns at once there), in any order."""
    return (
        not sp.logit_bias
        and not sp.mirostat
        and sp.typical_p >= 1.0
        and sp.top_n_sigma <= 0
        and sp.xtc_probability <= 0
        and sp.dynatemp_range <= 0
        and sp.dry_multiplier == 0
    )


def greedy(sp: Sampling) -> bool:
    """Whether the chain returns the highest logit: temperature 0, neutral penalties and a plain chain."""
    return sp.temperature <= 0 and _neutral(sp) and _plain(sp)


def _logit_bias(engine: Engine, sp: Sampling) -> list[tuple[int, float]]:
    """llama-server's logit bias: the request's, then -inf on every end-of-generation token with ignore_eos."""
    biases = [(t, b) for t, b in sp.logit_bias if 0 <= t < engine.n_vocab]
    if sp.ignore_eos:
        biases += [(t, float("-inf")) for t in engine.eog_tokens()]
    return biases


def _stage(engine: Engine, sp: Sampling, name: str, seed: int) -> Any:
    """One of llama-server's samplers by name (`common_sampler_init`), or None where its setting is neutral
    (llama.cpp's would return at once)."""
    if name == "penalties":
        if _neutral(sp):
            return None
        last_n = engine.n_ctx if sp.repeat_last_n < 0 else sp.repeat_last_n  # -1: the whole context
        return llama_cpp.llama_sampler_init_penalties(
            engine.n_vocab, last_n, sp.repeat_penalty, sp.frequency_penalty, sp.presence_penalty
        )
    if name == "dry":
        if sp.dry_multiplier == 0:
            return None
        breakers = [b.encode("utf-8") for b in sp.dry_sequence_breakers]
        c_breakers = (ctypes.c_char_p * len(breakers))(*breakers)
        return llama_cpp.llama_sampler_init_dry(
            engine.vocab,
            sp.dry_multiplier,
            sp.dry_base,
            sp.dry_allowed_length,
            sp.dry_penalty_last_n,
            c_breakers,
            len(breakers),
        )
    if name == "top_n_sigma":
        return llama_cpp.llama_sampler_init_top_n_sigma(sp.top_n_sigma) if sp.top_n_sigma > 0 else None
    if name == "top_k":
        return llama_cpp.llama_sampler_init_top_k(sp.top_k)
    if name == "typ_p":
        return llama_cpp.llama_sampler_init_typical(sp.typical_p, sp.min_keep) if sp.typical_p < 1.0 else None
    if name == "top_p":
        return llama_cpp.llama_sampler_init_top_p(sp.top_p, sp.min_keep)
    if name == "min_p":
        return llama_cpp.llama_sampler_init_min_p(sp.min_p, sp.min_keep)
    if name == "xtc":
        if sp.xtc_probability <= 0:
            return None
        return llama_cpp.llama_sampler_init_xtc(sp.xtc_probability, sp.xtc_threshold, sp.min_keep, seed)
    if name == "temperature":
        return llama_cpp.llama_sampler_init_temp_ext(sp.temperature, sp.dynatemp_range, sp.dynatemp_exponent)
    raise InvalidRequest(f"sampler {name!r} is not supported")  # `Sampling` checked the names already


def build_chain(engine: Engine, sp: Sampling) -> Any:
    """llama.cpp's sampler chain for `sp`, as llama-server's `common_sampler_init` builds it: the logit bias, then
    the samplers in `sp.samplers` order and `dist`, or with Mirostat temperature and Mirostat. Built once per
    request; a sampler whose setting is neutral is left out (it would change nothing)."""
    params = llama_cpp.llama_sampler_chain_default_params()
    params.no_perf = True
    chain = llama_cpp.llama_sampler_chain_init(params)
    add = llama_cpp.llama_sampler_chain_add
    seed = _DEFAULT_SEED if sp.seed is None else sp.seed
    biases = _logit_bias(engine, sp)
    if biases:
        arr = (llama_cpp.llama_logit_bias * len(biases))(*(llama_cpp.llama_logit_bias(t, b) for t, b in biases))
        add(chain, llama_cpp.llama_sampler_init_logit_bias(engine.n_vocab, len(biases), arr))
    if sp.mirostat == 0:
        for name in sp.samplers:
            stage = _stage(engine, sp, name, seed)
            if stage is not None:
                add(chain, stage)
        add(chain, llama_cpp.llama_sampler_init_dist(seed))
    else:
        add(chain, llama_cpp.llama_sampler_init_temp(sp.temperature))
        if sp.mirostat == 1:
            add(
                chain,
                llama_cpp.llama_sampler_init_mirostat(engine.n_vocab, seed, sp.mirostat_tau, sp.mirostat_eta, 100),
            )
        else:
            add(chain, llama_cpp.llama_sampler_init_mirostat_v2(seed, sp.mirostat_tau, sp.mirostat_eta))
    return chain


class Sampler:
    """A llama.cpp sampler chain in llama-server's order, built from sampling settings, plus a grammar."""

    def __init__(self, engine: Engine, sampling: Sampling, grammar: GrammarSpec | None = None) -> None:
        self._engine = engine
        self._grammar: Any = None
        sp = sampling
        self._chain: Any = build_chain(engine, sp)
        # post-sampling probabilities read the chain's candidates: every token then goes through the chain
        self._post = sp.n_probs > 0 and sp.post_sampling_probs
        # greedy with a plain chain: the chain returns the highest logit (top-k, top-p and min-p keep it,
        # temperature 0 drops the rest, dist then has one candidate), so an argmax on llama.cpp's logits in place
        # gives the same token without the chain's copy of the whole vocabulary; a tie for the highest logit (or a
        # NaN) goes to the chain, whose order among equals decides as before
        self._argmax = grammar is None and greedy(sp) and not sp.ignore_eos and not self._post
        if grammar is not None or self._post:
            self._cur = np.zeros(engine.n_vocab, dtype=_TOKEN_DATA)
            self._ids = np.arange(engine.n_vocab, dtype=np.int32)
            self._arr = llama_cpp.llama_token_data_array(
                self._cur.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data)), engine.n_vocab, -1, False
            )
        if grammar is not None:
            self._grammar = init_grammar(engine, grammar)
            # greedy: the chain picks the highest logit, so the first token of the logits in descending order that
            # the grammar allows is what sample-check-resample returns (and cheaper)
            self._greedy = greedy(sp) and not self._post
            self._banned = frozenset(engine.eog_tokens()) if sp.ignore_eos else frozenset()
            if grammar.prefill and not grammar.lazy:
                for tok in self._prefill_tokens(grammar.prefill):
                    if not self._allows(tok):  # accepting a refused token would abort the process
                        self.close()
                        raise InvalidRequest("the grammar does not start with the generation prompt's tokens")
                    llama_cpp.llama_sampler_accept(self._grammar, tok)

    def _prefill_tokens(self, text: str) -> list[int]:
        """llama-server's prefill tokens: the text tokenized, a leading space-only piece dropped."""
        eng = self._engine
        tokens = eng.tokenize(text, add_special=False, parse_special=True)
        if tokens and not text[0].isspace():
            first = eng.token_to_piece(tokens[0], special=True)
            if first[:1].isspace():
                tokens = tokens[1:]
        return tokens

    def sample(self, idx: int = -1, *, grammar: bool = True) -> int:
        """Sample from the logits of output `idx` (-1: the last evaluated token) and accept the token (into
        the grammar too, unless `grammar` is False: then the grammar neither constrains this token nor sees it).
        A speculative draft is verified by sampling at each drafted position in turn and comparing: the chain's
        state and random draws are then exactly those of unspeculated decoding."""
        if self._argmax:
            tok = self._engine.argmax(idx)
            if tok >= 0:
                return tok  # the chain's accept is a no-op here (neutral penalties, no grammar)
        if self._grammar is None or not grammar:
            if not self._post:
                return int(llama_cpp.llama_sampler_sample(self._chain, self._engine.ctx, idx))
            tok = self._apply(idx, grammar=False)  # llama_sampler_sample's apply, the candidates kept
            llama_cpp.llama_sampler_accept(self._chain, tok)
            return tok
        found = self._greedy_allowed(idx) if self._greedy else None
        if found is not None:
            tok = found
        else:
            tok = self._apply(idx, grammar=False)
            if not self._allows(tok):  # the grammar rejects it: sample again, grammar first
                tok = self._apply(idx, grammar=True)
                if not self._allows(tok):  # no token fits: accepting it would abort inside llama.cpp
                    raise InvalidGrammar("the grammar allows no token of this model here (it dead-ends)")
        llama_cpp.llama_sampler_accept(self._grammar, tok)
        llama_cpp.llama_sampler_accept(self._chain, tok)
        return tok

    def force(self, token: int) -> int:
        """Take `token` as the sampled one (a reasoning budget forcing its closer): the chain accepts it, and the
        grammar too if it allows it (llama-server's budget sets every other logit to -inf before sampling)."""
        if self._grammar is not None and self._allows(token):
            llama_cpp.llama_sampler_accept(self._grammar, token)
        llama_cpp.llama_sampler_accept(self._chain, token)
        return token

    def _greedy_allowed(self, idx: int, top: int = 64) -> int | None:
        """Greedy: the highest-logit token the grammar allows among the `top` best; None if there is none."""
        eng = self._engine
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(eng.ctx, idx), shape=(eng.n_vocab,))
        best = np.argpartition(logits, -top)[-top:]
        for tok in best[np.argsort(-logits[best], kind="stable")]:
            t = int(tok)
            if t not in self._banned and self._allows(t):
                return t
        return None

    def _allows(self, token: int) -> bool:
        """Whether the grammar accepts `token` next (llama-server's one-token check)."""
        one = llama_cpp.llama_token_data(token, 1.0, 0.0)
        single = llama_cpp.llama_token_data_array(ctypes.pointer(one), 1, -1, False)
        llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(single))
        return not (math.isinf(one.logit) and one.logit < 0)

    def _apply(self, idx: int, *, grammar: bool) -> int:
        eng = self._engine
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(eng.ctx, idx), shape=(eng.n_vocab,))
        cur = self._cur
        cur["id"] = self._ids
        cur["logit"] = logits
        cur["p"] = 0.0
        arr = self._arr
        arr.size, arr.selected, arr.sorted = eng.n_vocab, -1, False
        if grammar:
            llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(arr))
        llama_cpp.llama_sampler_apply(self._chain, ctypes.byref(arr))
        return int(cur["id"][arr.selected])

    def probs(
        self, idx: int, token: int, n: int, *, special: frozenset[int] = frozenset()
    ) -> tuple[float, list[Candidate]]:
        """The probability of `token`, sampled at output `idx`, and the `n` most probable tokens there, as
        llama-server's `populate_token_probs`: the softmax of the model's logits, or with `post_sampling_probs` the
        chain's candidates after the last sample (a candidate of probability 0 ends the list). Call right after
        `sample`, before the next decode. `special`: tokens whose pieces are shown (else a control token is b"")."""
        eng = self._engine
        if self._post:
            arr = self._arr
            cand = self._cur[: arr.size]
            at = ctypes.cast(arr.data, ctypes.c_void_p).value
            if at is not None and at != self._cur.ctypes.data:  # a sampler moved the candidates: read them there
                raw = ctypes.string_at(at, arr.size * _TOKEN_DATA.itemsize)
                cand = np.frombuffer(raw, dtype=_TOKEN_DATA)
            order = np.argsort(-cand["p"], kind="stable")
            ids, ps = cand["id"][order], cand["p"][order]
            hit = np.nonzero(ids == token)[0]
            p = float(ps[hit[0]]) if hit.size else 1.0
            top = [(int(t), float(q)) for t, q in zip(ids[:n], ps[:n], strict=True)]
            cut = next((i for i, (_, q) in enumerate(top) if q == 0.0), len(top))
            top = top[:cut]
        else:
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(eng.ctx, idx), shape=(eng.n_vocab,))
            best = float(logits.max())
            e = np.exp(logits - np.float32(best), dtype=np.float32)
            total = float(e.sum(dtype=np.float32))
            k = min(n, eng.n_vocab)
            head = np.argpartition(-logits, k - 1)[:k] if k < eng.n_vocab else np.arange(eng.n_vocab)
            head = head[np.argsort(-logits[head], kind="stable")]
            p = float(e[token]) / total
            top = [(int(t), float(e[t]) / total) for t in head]
        return p, [Candidate(t, eng.token_to_piece(t, special=t in special), q) for t, q in top]

    def accept(self, token: int) -> None:
        """Feed a prompt token to the chain (penalties see the prompt, as llama-server's); not the grammar."""
        llama_cpp.llama_sampler_accept(self._chain, token)

    def close(self) -> None:
        if self._chain is not None:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None
        if self._grammar is not None:
            llama_cpp.llama_sampler_free(self._grammar)
            self._grammar = None

    def __enter__(self) -> Sampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
