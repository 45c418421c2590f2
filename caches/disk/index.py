"""The disk tier's in-memory index: a token trie that finds the stored entry keeping the most of a prompt.

The rule (llama-server's prompt cache, as `DiskTier.find` applies it): a candidate keeps `n = lcp(entry,
prompt)` tokens, must keep more than `better_than` and at least a quarter of itself (`n / len >= 0.25` in
single precision, `caches.tokens.keeps_enough`); the most kept tokens wins, then the shorter entry, then
the smaller digest.
`scan_rank` is that rule written as a scan over every entry: the reference the trie is tested against.

`TokenIndex` is a radix trie (edges hold runs of tokens). Each node keeps the smallest `(length, digest)`
of the entries below it (`best`), and a lazy heap of its children's `best`, so an insert or a removal
updates one path. A lookup walks the prompt down the trie once and then climbs back: the deepest point
`k` whose subtree's shortest entry keeps a quarter of itself at `k` is the answer, and that entry is the
winner (any entry below it short enough for `k` would have passed deeper, so all of them keep exactly
`k`; the shortest also wins the tie). Lookup, insert and removal cost O(prompt length + path nodes ×
log children), whatever the number of entries.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from caches.tokens import keeps_enough, lcp

__all__ = ["TokenIndex", "scan_rank"]

_Best = tuple[int, str]  # (entry length, digest)


def _passes(kept: int, length: int) -> bool:
    return keeps_enough(kept, length)


def scan_rank(
    entries: Iterable[tuple[str, tuple[int, ...]]], prompt: tuple[int, ...], better_than: int = 0
) -> list[tuple[str, int]]:
    """Every candidate as (digest, kept tokens), best first: the reference scan (cost linear in entries)."""
    ranked: list[tuple[int, int, str]] = []
    for d, tokens in entries:
        n = lcp(tokens, prompt)
        if n <= better_than or not keeps_enough(n, len(tokens)):
            continue
        ranked.append((-n, len(tokens), d))
    ranked.sort()
    return [(d, -neg) for neg, _, d in ranked]


class _Node:
    __slots__ = ("best", "children", "end", "heap", "label")

    def __init__(self, label: tuple[int, ...]) -> None:
        self.label = label
        self.children: dict[int, _Node] = {}
        self.end: _Best | None = None
        self.best: _Best | None = None
        self.heap: list[tuple[int, str, int]] = []  # (length, digest, child key); stale rows skipped lazily

    def top(self) -> _Best | None:
        """The smallest `best` among the children (dropping stale heap rows)."""
        heap = self.heap
        while heap:
            n, d, key = heap[0]
            child = self.children.get(key)
            if child is not None and child.best == (n, d):
                return n, d
            heapq.heappop(heap)
        return None

    def note(self, key: int, best: _Best | None) -> None:
        """A child's `best` changed: record it."""
        if best is not None:
            heapq.heappush(self.heap, (best[0], best[1], key))
        if len(self.heap) > 2 * len(self.children) + 8:
            self.heap = [(c.best[0], c.best[1], k) for k, c in self.children.items() if c.best is not None]
            heapq.heapify(self.heap)

    def recompute(self) -> None:
        top = self.top()
        self.best = min(self.end, top) if self.end is not None and top is not None else (self.end or top)


class TokenIndex:
    """Entries (digest, tokens) in a radix trie; finds the one keeping the most of a prompt."""

    def __init__(self) -> None:
        self._root = _Node(())
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def add(self, digest: str, tokens: tuple[int, ...]) -> None:
        """Add an entry (non-empty tokens; one entry per token sequence: re-adding replaces the digest)."""
        if not tokens:
            raise ValueError("an entry needs tokens")
        node, i, n = self._root, 0, len(tokens)
        path: list[tuple[_Node, int]] = []  # (node, key of the next node in its children)
        while i < n:
            key = tokens[i]
            child = node.children.get(key)
            if child is None:
                child = _Node(tokens[i:])
                node.children[key] = child
                path.append((node, key))
                node, i = child, n
                break
            label = child.label
            m = len(label)
            seg = tokens[i : i + m]
            if seg != label:
                m = lcp(label, seg)
                mid = _Node(label[:m])
                child.label = label[m:]
                mid.children[child.label[0]] = child
                mid.best = child.best
                mid.note(child.label[0], child.best)
                node.children[key] = mid
                child = mid
            path.append((node, key))
            node, i = child, i + m
        if node.end is not None:
            self._n -= 1
        node.end = (n, digest)
        self._n += 1
        old = node.best
        node.recompute()
        self._propagate(path, node, old)

    def remove(self, digest: str, tokens: tuple[int, ...]) -> bool:
        """Remove the entry for these tokens (if it has this digest); True if it was there."""
        node, i, n = self._root, 0, len(tokens)
        path: list[tuple[_Node, int]] = []
        while i < n:
            child = node.children.get(tokens[i])
            if child is None or tokens[i : i + len(child.label)] != child.label:
                return False
            path.append((node, tokens[i]))
            node, i = child, i + len(child.label)
        if node.end is None or node.end[1] != digest or not path:
            return False
        node.end = None
        self._n -= 1
        old = node.best
        node.recompute()
        # Climb: drop empty leaves, fold a node left with one child and no entry into that child.
        while path:
            parent, key = path[-1]
            if node.best is None:  # nothing below: unlink
                del parent.children[key]
                path.pop()
                old = parent.best
                parent.recompute()
                node = parent
                continue
            if node.end is None and len(node.children) == 1:
                (only,) = node.children.values()
                only.label = node.label + only.label
                parent.children[key] = only
                node = only
            break
        self._propagate(path, node, old)
        return True

    def _propagate(self, path: list[tuple[_Node, int]], node: _Node, old: _Best | None) -> None:
        """`node`'s best went from `old` to its current value: update the ancestors on `path`."""
        while path and node.best != old:
            parent, key = path.pop()
            parent.note(key, node.best)
            old = parent.best
            parent.recompute()
            node = parent

    def prefixes(self, tokens: tuple[int, ...]) -> list[str]:
        """Digests of the entries whose tokens are a proper prefix of `tokens`."""
        out: list[str] = []
        node, i, n = self._root, 0, len(tokens)
        while i < n:
            if node.end is not None:
                out.append(node.end[1])
            child = node.children.get(tokens[i])
            if child is None or tokens[i : i + len(child.label)] != child.label:
                break
            node, i = child, i + len(child.label)
        return out

    def best(self, prompt: tuple[int, ...], better_than: int = 0) -> tuple[str, int] | None:
        """(digest, kept tokens) of the entry `scan_rank` ranks first, or None."""
        node, i, n = self._root, 0, len(prompt)
        reached: list[tuple[_Node, int]] = []  # (child, depth reached within its edge)
        while i < n:
            child = node.children.get(prompt[i])
            if child is None:
                break
            label = child.label
            seg = prompt[i : i + len(label)]
            m = len(label) if seg == label else lcp(label, seg)
            reached.append((child, i + m))
            if m < len(label):
                break
            node, i = child, i + m
        for child, k in reversed(reached):
            if k <= better_than:
                break
            best = child.best
            if best is not None and _passes(k, best[0]):
                return best[1], k
        return None
