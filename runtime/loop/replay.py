"""Byte-exact replay: a resent assistant turn that equals one turnstile generated is given to the model as the
tokens it generated, not as the template's re-rendering of it.

Coding agents resend the whole conversation every turn; the template renders the previous reply from the
parsed message (tool-call JSON re-serialized, whitespace normalized, the text re-tokenized), which differs
from the generated tokens by a byte or a token boundary, so the prompt's common prefix with the cached state
ends inside the previous reply and every turn recomputes it and everything after. antirez's ds4 server
replays the generated tokens instead; so does this module.

`Replay.remember(prompt, generated)` keeps the turn (the prompt tokens, then the generated ones, which must
end with an end-of-generation token). `Replay.splice(prompt, same)` looks for a kept turn whose prompt is a
prefix of the new prompt; the re-rendered reply is the new prompt's tokens from there up to the first
occurrence of the same end-of-generation token. When `same(rerendered_text, generated_text)` says the two are
the same reply (same text, same tool calls by name and parsed arguments, same reasoning: a template that
drops earlier reasoning is followed, not overridden), the generated tokens take the re-rendering's place;
this repeats (the spliced prompt is a prefix of the next kept turn's), so a long conversation replays every
reply turnstile generated. What the model sees differs from the plain rendering only in those replies'
spelling, which the model itself chose.

Invariants: a splice never changes tokens before the kept prompt's end or after the re-rendered reply; it
happens only when `same` says so; at most `MAX_TURNS` turns are kept per key (tenant) namespace (least recently
used dropped, so no key evicts another's), each at most `MAX_TOKENS` tokens, all of a namespace's at most
`MAX_NAMESPACE_TOKENS`. Shared between the sessions of
one namespace, like the prompt cache itself: a turn is reused only by a prompt of the same namespace that starts
with all of its prompt tokens.

With a data dir the turns are also kept on disk (`runtime.loop.replay_disk`: msgpack, checksummed, one folder
per namespace, the same bound and order), loaded on first use, so a restarted server replays as before.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from runtime.errors import ToolCallParseError
from runtime.log import get_logger
from runtime.loop.replay_disk import DiskRecords
from runtime.reasoning.formats import ReasoningFormat
from runtime.tools.plan import ToolPlan

__all__ = ["MAX_NAMESPACE_TOKENS", "MAX_TOKENS", "MAX_TURNS", "Replay", "Spliced", "same_reply"]

log = get_logger(__name__)

MAX_TURNS = 64
MAX_TOKENS = 1 << 20  # one turn's prompt and reply
MAX_NAMESPACE_TOKENS = 1 << 22  # every kept turn of one namespace (16 MiB of int32 tokens)


@dataclass(frozen=True)
class Spliced:
    """The prompt to run and what was replayed: (position, re-rendered tokens, generated tokens) per reply."""

    tokens: list[int]
    replays: tuple[tuple[int, int, int], ...] = ()

    def shift(self, positions: Sequence[int]) -> list[int]:
        """Token positions of the unspliced prompt (message starts) in the spliced one."""
        out = list(positions)
        for at, old, new in self.replays:
            out = [p + new - old if p > at else p for p in out]
        return out


Same = Callable[[Sequence[int], Sequence[int]], bool]  # (re-rendered tokens, generated tokens) -> same reply?


class Replay:
    """Kept turns (prompt + generated tokens) per namespace and the splice (module docstring); `disk`: where
    they are also kept (loaded on first use, in the worker thread like every other call)."""

    def __init__(self, max_turns: int = MAX_TURNS, disk: DiskRecords | None = None) -> None:
        self.max_turns = max_turns
        self.disk = disk
        self._loaded = disk is None
        self._spaces: dict[str, OrderedDict[bytes, tuple[array[int], array[int]]]] = {}
        self.spliced = 0  # replies replayed, since the start

    def _space(self, namespace: str) -> OrderedDict[bytes, tuple[array[int], array[int]]]:
        if not self._loaded:
            self._loaded = True
            assert self.disk is not None
            loaded = self.disk.load()
            for ns, key, p, g in loaded:
                self._keep(ns, key, p, g, write=False)
            if loaded:
                log.info("replay.loaded", turns=len(loaded), namespaces=len(self._spaces))
        return self._spaces.setdefault(namespace, OrderedDict())

    def _keep(self, namespace: str, key: bytes, p: array[int], g: array[int], *, write: bool) -> None:
        turns = self._spaces.setdefault(namespace, OrderedDict())
        turns[key] = (p, g)
        turns.move_to_end(key)
        if write and self.disk is not None:
            self.disk.write(namespace, key, p, g)
        while len(turns) > self.max_turns or (
            len(turns) > 1 and sum(len(a) + len(b) for a, b in turns.values()) > MAX_NAMESPACE_TOKENS
        ):
            old, _ = turns.popitem(last=False)
            if self.disk is not None:
                self.disk.drop(namespace, old)

    def turns(self, namespace: str = "") -> int:
        """How many turns are kept for `namespace`."""
        return len(self._space(namespace))

    def remember(self, prompt: Sequence[int], generated: Sequence[int], *, at_eog: bool, namespace: str = "") -> None:
        """Keep a finished turn (`at_eog`: its generation ended with an end-of-generation token, its last)."""
        if not at_eog or not generated or not prompt or len(prompt) + len(generated) > MAX_TOKENS:
            return
        self._space(namespace)
        p, g = array("i", prompt), array("i", generated)
        self._keep(namespace, p.tobytes()[-256:] + g.tobytes(), p, g, write=True)

    def splice(self, prompt: Sequence[int], same: Same, namespace: str = "") -> Spliced:
        """The prompt with every re-rendered reply that `same` accepts replaced by its generated tokens."""
        turns = self._space(namespace)
        if not turns:
            return Spliced(list(prompt))
        tokens = list(prompt)
        done: list[tuple[int, int, int]] = []
        used: set[bytes] = set()
        for _ in range(len(turns)):
            hit = self._next(turns, tokens, used, same)
            if hit is None:
                break
            key, n, end, generated = hit
            used.add(key)
            turns.move_to_end(key)
            if self.disk is not None:
                self.disk.touch(namespace, key)
            done.append((n, end - n, len(generated)))
            tokens[n:end] = generated
        if done:
            self.spliced += len(done)
            log.debug("replay.spliced", replies=len(done), at=[d[0] for d in done])
        return Spliced(tokens, tuple(done))

    @staticmethod
    def _next(
        turns: OrderedDict[bytes, tuple[array[int], array[int]]], tokens: list[int], used: set[bytes], same: Same
    ) -> tuple[bytes, int, int, array[int]] | None:
        """The longest kept prompt that prefixes `tokens` and whose reply `same` accepts there."""
        best: tuple[bytes, int, int, array[int]] | None = None
        for key, (p, g) in turns.items():
            n = len(p)
            if key in used or n >= len(tokens) or (best is not None and n <= best[1]):
                continue
            if tokens[n - 1] != p[-1] or array("i", tokens[:n]) != p:
                continue
            eog = g[-1]
            try:
                end = tokens.index(eog, n) + 1
            except ValueError:
                continue
            if tokens[n:end] == g.tolist() or not same(tokens[n : end - 1], g[:-1].tolist()):
                continue  # already the generated tokens, or another reply
            best = (key, n, end, g)
        return best


def same_reply(piece: Callable[[int], bytes], plan: ToolPlan | None, fmt: ReasoningFormat | None) -> Same:
    """Whether two token runs say the same reply: the same text; or the same reasoning (the text before the
    format's closer, stripped) and the same answer (stripped), read by the turn's tool plan when it has one
    (same content, same calls by name and parsed arguments)."""

    def text(tokens: Sequence[int]) -> str:  # SentencePiece's escaped space ("\u2581") read as a space
        return b"".join(piece(t) for t in tokens).decode("utf-8", "replace").replace("\u2581", " ")

    def parts(s: str) -> tuple[str, str]:
        if fmt is not None and fmt.end in s:
            head, _, tail = s.partition(fmt.end)
            return head.replace(fmt.start, "", 1).strip(), tail.strip()
        return "", s.strip()

    def same(rerendered: Sequence[int], generated: Sequence[int]) -> bool:
        a, b = text(rerendered), text(generated)
        if a == b:
            return True
        (ra, ca), (rb, cb) = parts(a), parts(b)
        if ra != rb:
            return False
        if plan is None:
            return ca == cb
        try:
            pa, pb = plan.parse(ca, seed="replay"), plan.parse(cb, seed="replay")
        except ToolCallParseError:
            return False
        calls = [(c.name, c.arguments) for c in pa.tool_calls] == [(c.name, c.arguments) for c in pb.tool_calls]
        return calls and pa.content.strip() == pb.content.strip()

    return same
