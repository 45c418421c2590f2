"""Draft-less speculation's lookup side: an n-gram index over one conversation's tokens and the drafter.

`NgramIndex` mirrors a token list (the slot's: prompt and generated, exactly what the sequence's memory
holds) and maps every n-gram in it to the positions that follow it. It is kept incrementally: `append` as
tokens are accepted, `sync` (common prefix, truncate, extend: linear in what changed) when the slot's
tokens were replaced by another conversation's state. Invariant: `index.tokens` equals the list it
mirrors after every `sync`/`append`, and `_follow[g]` lists, ascending, every i with `tokens[i-n:i] == g`.

`Drafter` proposes what comes next after the last sampled token, llama-server's `ngram-map-k` idea
(find the latest earlier occurrence of the last n tokens, draft what followed it), with two changes:
among the recent occurrences it takes the one whose match extends furthest back, and the draft length
follows the match length and the acceptance so far (`DraftLength`), so text that does not copy drafts
rarely and briefly. Pure Python, no llama.cpp: tested without a model.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from caches.tokens import lcp

__all__ = ["DraftLength", "Drafter", "NgramIndex"]

NGRAM = 4  # key length: the last 4 tokens (with the sampled one) must have occurred before
CANDIDATES = 8  # recent occurrences of the key compared by how far back they match
MATCH_CAP = 64  # how far back a match is extended


class NgramIndex:
    """Every n-gram of a token list -> the positions that follow its occurrences."""

    def __init__(self, n: int = NGRAM) -> None:
        if n < 1:
            raise ValueError(f"n-gram length must be >= 1, not {n}")
        self.n = n
        self.tokens: list[int] = []
        self._follow: dict[tuple[int, ...], list[int]] = {}

    def __len__(self) -> int:
        return len(self.tokens)

    def append(self, token: int) -> None:
        toks, i = self.tokens, len(self.tokens)
        if i >= self.n:
            key = tuple(toks[i - self.n : i])
            found = self._follow.get(key)
            if found is None:
                self._follow[key] = [i]
            else:
                found.append(i)
        toks.append(token)

    def extend(self, tokens: Sequence[int]) -> None:
        start = len(self.tokens)
        self.tokens.extend(tokens)
        toks, n, follow = self.tokens, self.n, self._follow
        lo, hi = max(start, n), len(toks)  # the new positions i that have n tokens before them
        if hi <= lo:
            return
        grams = zip(*(toks[lo - n + j : hi - n + j] for j in range(n)), strict=True)
        for i, key in enumerate(grams, start=lo):
            found = follow.get(key)
            if found is None:
                follow[key] = [i]
            else:
                found.append(i)

    def truncate(self, m: int) -> None:
        """Keep the first `m` tokens (the positions after them leave the index)."""
        toks, n = self.tokens, self.n
        for i in range(len(toks) - 1, max(m, n) - 1, -1):
            key = tuple(toks[i - n : i])
            found = self._follow[key]
            found.pop()  # i is the largest position of its key: positions are appended in order
            if not found:
                del self._follow[key]
        del toks[m:]

    def sync(self, tokens: Sequence[int]) -> int:
        """Mirror `tokens` again; returns how many tokens were (re)indexed."""
        keep = lcp(self.tokens, tokens)
        self.truncate(keep)
        self.extend(tokens[keep:])
        return len(tokens) - keep

    def follows(self, key: tuple[int, ...]) -> list[int]:
        """The positions right after each occurrence of `key` (ascending); [] if it never occurred."""
        return self._follow.get(key, [])

    def lookup(self, last: int) -> tuple[int, int]:
        """Where the continuation of `tokens + [last]` may be copied from: (position, match length).

        The position p is such that `tokens[p-n:p]` equals the last n tokens of `tokens + [last]`; among the
        `CANDIDATES` latest such p, the one whose match reaches furthest back (the latest on a tie). (0, 0) if
        the key never occurred.
        """
        toks, n = self.tokens, self.n
        if len(toks) < n - 1:
            return 0, 0
        key = (*toks[len(toks) - n + 1 :], last) if n > 1 else (last,)
        found = self._follow.get(key)
        if not found:
            return 0, 0
        end = len(toks) - n  # index in `toks` of the token before the key (the key's first is toks[end+1])
        best_p, best_len = 0, 0
        for p in reversed(found[-CANDIDATES:]):
            length = n
            a, b = p - n - 1, end
            while a >= 0 and length < MATCH_CAP and toks[a] == toks[b]:
                length += 1
                a -= 1
                b -= 1
            if length > best_len:
                best_p, best_len = p, length
        return best_p, best_len


@dataclass
class DraftLength:
    """How many tokens to draft: grows while drafts are accepted whole, shrinks to what was accepted.

    A match of length L allows at most 2^(L - n + 1) tokens (a chance n-gram match drafts two; each further
    matching token doubles that, so a real copy reaches `cap` within a few steps), capped by `limit`, which
    doubles after a fully accepted draft and falls to the accepted count + 1 after a partial one; `cooldown`
    steps without drafting follow a draft that got nothing accepted, doubling with each such miss in a row
    (reset by any acceptance). A short match (under `n + SHORT` tokens: likely chance, as in ordinary chat)
    drafts only while the accepted share of recent drafts (`rate`, a moving average that starts at 1) is at
    least `GATE`; a longer one (a real copy) always may. So text that does not copy stops paying for
    chance-match drafts after a few rejected ones.
    """

    cap: int = 32
    limit: int = 16
    misses: int = 0
    cooldown: int = 0
    rate: float = 1.0
    kept: int = 0  # drafted tokens accepted in this request
    breaks: int = 0  # drafts not accepted whole

    SHORT = 2
    GATE = 0.5
    DECAY = 0.7  # weight of the earlier drafts in `rate`
    # a drafted token's extra cost in one-token steps: SmolLM2 on 2 CPU threads evaluates 8 tokens in about 4x and
    # 32 in about 15x one token's time (benchmarks/RESULTS.md), about 0.44 per token beyond the first
    COST = 0.44
    PRIOR = 19  # q starts at 0.95 (19 of 20)

    def allowed(self, match_len: int, n: int) -> int:
        if self.cooldown > 0:
            self.cooldown -= 1
            return 0
        if match_len < n or (match_len < n + self.SHORT and self.rate < self.GATE):
            return 0
        k = min(self.limit, self.cap, 1 << min(match_len - n + 1, 16))
        return min(k, self.worth()) if self.breaks else k

    def worth(self) -> int:
        """The draft length that maximises the expected tokens per unit of batch cost (`COST` extra per drafted
        token) if each drafted token is accepted, after the previous one, with this request's observed
        probability q: (accepted + `PRIOR`) / (accepted + breaks + `PRIOR` + 1). It bounds the drafts once one
        draft was not accepted whole (a copy that ends: the next long draft past its end would be lost)."""
        q = (self.kept + self.PRIOR) / (self.kept + self.breaks + self.PRIOR + 1)
        return _best_length(round(q, 3), self.COST, self.cap)

    def update(self, drafted: int, accepted: int) -> None:
        if drafted == 0:
            return
        self.kept += accepted
        self.breaks += accepted < drafted
        self.rate = self.DECAY * self.rate + (1 - self.DECAY) * accepted / drafted
        if accepted == drafted:
            self.limit = min(self.cap, max(self.limit, 2 * drafted))
            self.misses = 0
        elif accepted == 0:
            self.misses += 1
            self.cooldown = min(64, 1 << (self.misses - 1))
            self.limit = max(2, self.limit // 2)
        else:
            self.limit = max(2, accepted + 1)
            self.misses = 0


@functools.lru_cache(maxsize=1024)
def _best_length(q: float, cost: float, cap: int) -> int:
    """argmax over k in 1..cap of (1 + E[accepted]) / (1 + cost k), E[accepted] = q (1 - q^k) / (1 - q)."""
    best_k, best = 1, 0.0
    for k in range(1, cap + 1):
        expected = k if q >= 1.0 else q * (1 - q**k) / (1 - q)
        value = (1 + expected) / (1 + cost * k)
        if value > best:
            best_k, best = k, value
    return best_k


class Drafter:
    """Drafts for one request from a conversation's index; counts what it drafted and what was accepted."""

    def __init__(
        self, index: NgramIndex, length: DraftLength | None = None, ends: Callable[[int], bool] | None = None
    ) -> None:
        self.index = index
        self.length = length or DraftLength()
        self.ends = ends  # a token that ends the reply (end of generation): nothing is drafted past it
        self.drafted = 0
        self.accepted = 0

    def draft(self, last: int, room: int) -> list[int]:
        """Up to `room` tokens expected after `index.tokens + [last]`; [] when nothing is worth drafting."""
        if room <= 0:
            return []
        p, match_len = self.index.lookup(last)
        if match_len == 0:
            return []
        k = min(room, self.length.allowed(match_len, self.index.n))
        draft = self.index.tokens[p : p + k]
        if self.ends is not None:  # past an end-of-generation token a draft is never used, only evaluated
            for i, tok in enumerate(draft):
                if self.ends(tok):
                    return draft[: i + 1]
        return draft

    def accepted_n(self, drafted: int, accepted: int) -> None:
        """Record a verified draft: `accepted` of its `drafted` tokens were what the sampler chose."""
        self.drafted += drafted
        self.accepted += accepted
        self.length.update(drafted, accepted)
