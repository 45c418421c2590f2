"""The sampler: a llama.cpp sampler chain in llama-server's order, built from `Sampling` settings."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import llama_cpp

from sessions import Sampling

if TYPE_CHECKING:
    from runtime.engine import Engine

_DEFAULT_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: a random seed


class Sampler:
    """A llama.cpp sampler chain in llama-server's order, built from sampling settings."""

    def __init__(self, engine: Engine, sampling: Sampling) -> None:
        self._engine = engine
        params = llama_cpp.llama_sampler_chain_default_params()
        params.no_perf = True
        chain = llama_cpp.llama_sampler_chain_init(params)
        sp = sampling
        add = llama_cpp.llama_sampler_chain_add
        if sp.ignore_eos:  # as llama-server: every end-of-generation token gets a -inf logit bias
            eog = engine.eog_tokens()
            biases = (llama_cpp.llama_logit_bias * len(eog))(
                *(llama_cpp.llama_logit_bias(t, float("-inf")) for t in eog)
            )
            add(chain, llama_cpp.llama_sampler_init_logit_bias(engine.n_vocab, len(eog), biases))
        add(
            chain,
            llama_cpp.llama_sampler_init_penalties(
                engine.n_vocab,
                engine.n_ctx if sp.repeat_last_n < 0 else sp.repeat_last_n,  # -1: the whole context
                sp.repeat_penalty,
                sp.frequency_penalty,
                sp.presence_penalty,
            ),
        )
        add(chain, llama_cpp.llama_sampler_init_top_k(sp.top_k))
        add(chain, llama_cpp.llama_sampler_init_top_p(sp.top_p, 0))
        add(chain, llama_cpp.llama_sampler_init_min_p(sp.min_p, 0))
        add(chain, llama_cpp.llama_sampler_init_temp_ext(sp.temperature, 0.0, 1.0))
        add(chain, llama_cpp.llama_sampler_init_dist(_DEFAULT_SEED if sp.seed is None else sp.seed))
        self._chain: Any = chain

    def sample(self) -> int:
        """Sample from the context's last logits and accept the token."""
        tok = int(llama_cpp.llama_sampler_sample(self._chain, self._engine.ctx, -1))
        return tok

    def accept(self, token: int) -> None:
        llama_cpp.llama_sampler_accept(self._chain, token)

    def close(self) -> None:
        if self._chain is not None:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None

    def __enter__(self) -> Sampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
