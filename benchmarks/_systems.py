"""The systems the chat benchmarks compare, each answering `turn(conv, messages) -> Outcome`:

- `TurnstileSystem`: a `Runtime` (driven from this thread through an anyio blocking portal);
- `LlamaCppSystem`: llama-cpp-python's `Llama.create_chat_completion`, with or without `LlamaRAMCache`;
- `ServerSystem`: llama-server `-np 1 --cache-ram MIB` through the `LlamaServer` harness.

"Ideal" prefill is measured on turnstile's own token lists: for each turn, the prompt tokens that no
earlier state of that conversation holds, `len(prompt) - lcp(prompt, that conversation's previous prompt
+ generated tokens)` (the slot's token list right after its previous turn).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from contextlib import ExitStack
from typing import Any

import msgspec

from benchmarks._workload import N_BATCH, N_UBATCH, Factory, Outcome, Settings
from caches.tokens import lcp
from runtime.config import KV_TYPES
from tests.support.llama_server import LlamaServer
from tests.support.workloads import Messages

__all__ = [
    "LlamaCppSystem",
    "ServerSystem",
    "TurnstileSystem",
    "llama_cpp_factory",
    "server_factory",
    "turnstile_factory",
]


class TurnstileSystem:
    """A turnstile Runtime, opened in a blocking portal so that the driver stays synchronous."""

    def __init__(
        self,
        name: str,
        settings: Settings,
        *,
        data_dir: str | os.PathLike[str] | None = None,
        cache_ram_mib: int | None = None,
        policy: str = "fifo",
        options: dict[str, Any] | None = None,
    ) -> None:
        """`options`: more `Runtime.open` keywords (shared_blocks, cache_rules, ...)."""
        from anyio.from_thread import start_blocking_portal

        from runtime import Runtime

        self.name = name
        self.settings = settings
        self._stack = ExitStack()
        self._states: dict[int, list[int]] = {}  # each conversation's slot tokens after its last turn
        self._sessions: set[int] = set()
        t0 = time.perf_counter()
        try:
            self._portal = self._stack.enter_context(start_blocking_portal())
            self.rt = self._stack.enter_context(
                self._portal.wrap_async_context_manager(
                    Runtime.open(
                        settings.model,
                        data_dir=data_dir,
                        n_ctx=settings.n_ctx,
                        n_threads=settings.threads,
                        n_threads_batch=settings.threads,
                        n_batch=N_BATCH,
                        n_ubatch=N_UBATCH,
                        flash_attn=True,
                        cache_ram_mib=cache_ram_mib,
                        policy=policy,
                        **settings.runtime_options,
                        **(options or {}),
                    )
                )
            )
        except BaseException:
            self._stack.close()
            raise
        self.open_seconds = time.perf_counter() - t0

    def remember(self, states: dict[int, list[int]]) -> None:
        """Carry the conversations' token lists over from an earlier runtime (a restart)."""
        self._states.update(states)

    def fork(self, conv: int, new: int) -> None:
        """Fork conversation `conv` into `new` (its session and its token list)."""
        self._portal.call(self.rt.fork, f"conv-{conv}", f"conv-{new}")
        self._sessions.add(new)
        self._states[new] = list(self._states.get(conv, []))

    @property
    def states(self) -> dict[int, list[int]]:
        return dict(self._states)

    def turn(self, conv: int, msgs: Messages) -> Outcome:
        sid = f"conv-{conv}"
        if conv not in self._sessions:
            known = self._portal.call(self.rt.list_sessions)
            if sid not in known:
                system = msgs[0]["content"] if msgs and msgs[0]["role"] == "system" else None
                self._portal.call(lambda: self.rt.create_session(sid, system=system, **self.settings.sampling))
            self._sessions.add(conv)
        prompt = self.rt.backend.engine.render(msgs, spans=False).tokens  # the worker is idle between turns
        ideal = len(prompt) - lcp(prompt, self._states.get(conv, []))
        reply = self._portal.call(lambda: self.rt.chat(sid, msgs[-1]["content"]))
        if reply.usage.prompt_tokens != len(prompt):
            raise RuntimeError(
                f"{self.name}: the runtime's prompt ({reply.usage.prompt_tokens} tokens) is not the driver's "
                f"({len(prompt)}): the session's history differs from the workload's"
            )
        slot = self.rt.backend.slot
        self._states[conv] = list(slot.last.tokens(slot.tokens))  # its last token too, once settled
        u = reply.usage
        return Outcome(reply.text, u.prompt_tokens, u.prefilled_tokens, u.generated_tokens, ideal)

    def stats(self) -> dict[str, Any]:
        """The runtime's slot and disk counters (for the JSON)."""
        st = self.rt.stats()
        return {"slot": msgspec.to_builtins(st.slot), "disk": msgspec.to_builtins(st.disk)}

    def close(self) -> None:
        self._stack.close()


class LlamaCppSystem:
    """llama-cpp-python's `Llama.create_chat_completion`, optionally with a `LlamaRAMCache`.

    Prefilled tokens: the length of each completion's first `Llama.eval` call (the prompt suffix that
    prefix matching against the context, or a state loaded from the cache, did not cover); later calls
    evaluate one generated token each.
    """

    def __init__(self, name: str, settings: Settings, *, ram_cache_bytes: int | None = None) -> None:
        import llama_cpp
        from llama_cpp.llama_cache import LlamaRAMCache

        self.name = name
        self.settings = settings
        t0 = time.perf_counter()
        self.llm = llama_cpp.Llama(
            str(settings.model),
            n_ctx=settings.n_ctx,
            n_batch=N_BATCH,
            n_ubatch=N_UBATCH,
            n_threads=settings.threads,
            n_threads_batch=settings.threads,
            flash_attn=True,
            type_k=KV_TYPES[settings.cache_type],
            type_v=KV_TYPES[settings.cache_type],
            n_gpu_layers=settings.n_gpu_layers,
            seed=settings.seed,
            verbose=False,
        )
        if ram_cache_bytes is not None:
            self.llm.set_cache(LlamaRAMCache(capacity_bytes=ram_cache_bytes))
        self.open_seconds = time.perf_counter() - t0
        self._evals: list[int] = []
        original = self.llm.eval

        def counting_eval(tokens: Sequence[int]) -> None:
            self._evals.append(len(tokens))
            original(tokens)

        self.llm.eval = counting_eval  # type: ignore[method-assign]

    def turn(self, conv: int, msgs: Messages) -> Outcome:
        self._evals.clear()
        res: Any = self.llm.create_chat_completion(
            messages=msgs,  # type: ignore[arg-type]
            max_tokens=self.settings.max_tokens,
            temperature=0.0,
            seed=self.settings.seed,
        )
        usage = res["usage"]
        text = res["choices"][0]["message"]["content"] or ""
        prefilled = self._evals[0] if self._evals else 0
        return Outcome(text, int(usage["prompt_tokens"]), prefilled, int(usage["completion_tokens"]))

    def close(self) -> None:
        self.llm.close()


class ServerSystem:
    """llama-server `-np 1 --cache-ram MIB` on a loopback port (started here, stopped by close())."""

    def __init__(self, name: str, settings: Settings, binary: str | os.PathLike[str], *, cache_ram_mib: int) -> None:
        self.name = name
        self.settings = settings
        t0 = time.perf_counter()
        self.srv = LlamaServer(
            binary,
            settings.model,
            n_ctx=settings.n_ctx,
            threads=settings.threads,
            cache_ram_mib=cache_ram_mib,
            n_batch=N_BATCH,
            n_ubatch=N_UBATCH,
            seed=settings.seed,
            extra_args=settings.server_args,
        )
        self.srv.start()
        self.open_seconds = time.perf_counter() - t0

    def turn(self, conv: int, msgs: Messages) -> Outcome:
        r = self.srv.chat(msgs, max_tokens=self.settings.max_tokens, temperature=0.0, seed=self.settings.seed)
        return Outcome(r.text, r.prompt_tokens, r.prompt_n, r.predicted_n)

    def close(self) -> None:
        self.srv.stop()


def llama_cpp_factory(label: str, settings: Settings, ram_cache_bytes: int | None = None) -> Factory:
    return lambda: LlamaCppSystem(label, settings, ram_cache_bytes=ram_cache_bytes)


def server_factory(label: str, settings: Settings, binary: str, cache_ram_mib: int) -> Factory:
    return lambda: ServerSystem(label, settings, binary, cache_ram_mib=cache_ram_mib)


def turnstile_factory(
    label: str,
    settings: Settings,
    *,
    data_dir: str | None = None,
    cache_ram_mib: int | None = None,
    options: dict[str, Any] | None = None,
) -> Factory:
    """`options`: more `Runtime.open` keywords (cache_rules, shared_blocks, ...)."""
    return lambda: TurnstileSystem(label, settings, data_dir=data_dir, cache_ram_mib=cache_ram_mib, options=options)
