"""Splitting generated text into reasoning and answer, whole or piece by piece while it streams.

`Splitter` is a small state machine over the text as it comes: before the block (leading whitespace, then
the opener or the answer), inside the block (until the closer), the answer's head (whitespace and the
format's answer headers), the answer. It never emits a tag into either part: text that may still become a
tag (a partial opener, closer, header or trailer at the end) and whitespace that may still be stripped are
held back until the next piece decides, and given out by `flush`. `split` is the same machine run once, so
the pieces streamed for any cut of the text add up to exactly what `split` returns for the whole text.

Parses as llama-server's (expected parses in tests/test-chat.cpp, and its replies on the vendored
templates): with the template's facts (`with_template`), the opener and the closer each take at most the
whitespace the template writes after them and the reasoning is what lies between, as it is; without them,
the reasoning is trimmed and the answer loses its leading whitespace. An answer without a block is kept as
it is; a block is only
recognised at the start of the output (or the output starts inside it, when the generation prompt opened
it); a block that never closes is all reasoning (the reply was cut); anything else is plain answer text,
tags and all. Nothing raises.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from runtime.reasoning.formats import ReasoningFormat

__all__ = ["Reasoning", "Split", "Splitter", "held_back", "split"]


class Reasoning(str):
    """A streamed piece of the model's reasoning; answer pieces are plain `str`."""

    __slots__ = ()


@dataclass(frozen=True)
class Split:
    """A reply's text in its parts: the reasoning ("" when none) and the answer."""

    reasoning: str
    content: str


_HEAD, _OPENED, _REASONING, _ANSWER_HEAD, _ANSWER = range(5)


def _optspace(buf: str, spaces: str, final: bool) -> int | None:
    """How much of `buf` llama-server's `optspace` takes: each of `spaces` in turn, if it is next (None: `buf`
    ran out before `spaces` did, so the next piece decides)."""
    n = 0
    for ch in spaces:
        if n == len(buf):
            return n if final else None
        if buf[n] == ch:
            n += 1
    return n


def held_back(text: str, tags: Sequence[str]) -> int:
    """How many characters at the end of `text` are a proper prefix of one of `tags` (may become one)."""
    best = 0
    for tag in tags:
        for n in range(min(len(tag) - 1, len(text)), best, -1):
            if text.endswith(tag[:n]):
                best = n
                break
    return best


class Splitter:
    """Feeds generated text, returns its pieces: `Reasoning` for reasoning, `str` for the answer.

    `fmt` None, or `keep=True` (llama-server's `reasoning_format: none`): everything is answer text, with
    `prefix` first, and without the literals the format drops then (`ReasoningFormat.dropped_when_kept`:
    gpt-oss's final channel header, Command R7B's answer markers), as llama-server gives it.
    `prefix`: the part of the generation prompt from the opener on, when it opened the block (`inside`: the
    output starts in it) or wrote an empty one (Qwen3's thinking-off `<think>\n\n</think>\n\n`): as
    llama-server, the output is parsed as if it followed that text.
    """

    def __init__(
        self, fmt: ReasoningFormat | None, *, inside: bool = False, keep: bool = False, prefix: str = ""
    ) -> None:
        self.fmt = fmt
        self._plain = fmt is None or keep
        self._buf = prefix  # "none": the text; else what the generation prompt wrote from the opener on
        self._state = _OPENED if inside and not self._plain else _HEAD
        if self._state == _OPENED:  # what the generation prompt wrote in the block (QwQ: "\n")
            self._buf = prefix[len(fmt.start) :] if fmt is not None and prefix.startswith(fmt.start) else ""
        self._said_reasoning = False
        self._ws = ""  # leading whitespace of the reasoning, held until the reasoning has more
        self._strip = False  # the answer's head drops leading whitespace (it follows a block)
        self._closed = False  # a block was closed (Granite wraps its answer in `<response>` only then)

    def feed(self, text: str) -> list[str]:
        """The pieces `text` completes (possibly none: it may end in a tag still being written)."""
        self._buf += text
        return self._run(final=False)

    def flush(self) -> list[str]:
        """The rest, at the end of the output."""
        return self._run(final=True)

    def _run(self, final: bool) -> list[str]:
        out: list[str] = []
        if self._plain or self.fmt is None:  # as llama-server's "none": the text, without the answer's headers
            return self._emit_without(self._buf, self.fmt.dropped_when_kept() if self.fmt else (), final, out)
        fmt = self.fmt
        while True:
            buf = self._buf
            if self._state == _HEAD:
                s = buf.lstrip()
                if s.startswith(fmt.start):
                    self._buf, self._state = s[len(fmt.start) :], _OPENED
                    continue
                if not final and (not s or fmt.start.startswith(s)):
                    return out
                self._state, self._strip = _ANSWER_HEAD, False
            elif self._state == _OPENED:  # the opener's own whitespace (trimming formats: any, later)
                if fmt.space_after_start is not None:
                    n = _optspace(buf, fmt.space_after_start, final)
                    if n is None:
                        return out
                    self._buf = buf[n:]
                self._state = _REASONING
            elif self._state == _REASONING:
                trim = fmt.trim
                i = buf.find(fmt.end)
                if i >= 0:
                    self._reason(out, buf[:i].rstrip() if trim else buf[:i])
                    self._buf, self._state, self._strip = buf[i + len(fmt.end) :], _ANSWER_HEAD, True
                    self._closed = True
                    continue
                if final:
                    self._reason(out, buf.rstrip() if trim else buf)
                    self._buf = ""
                    return out
                body = buf[: len(buf) - held_back(buf, (fmt.end,))]
                body = body.rstrip() if trim else body
                self._reason(out, body)
                self._buf = buf[len(body) :]
                return out
            elif self._state == _ANSWER_HEAD:
                if self._strip and fmt.space_after is not None:  # at most the template's own whitespace
                    n = _optspace(buf, fmt.space_after, final)
                    if n is None:
                        return out
                    buf, self._strip = buf[n:], False
                    self._buf = buf
                s = buf.lstrip() if self._strip else buf
                headers = self._wrappers(fmt.content_prefixes)
                opening = next((p for p in headers if s.startswith(p)), None)
                if opening is not None:
                    self._buf = s[len(opening) :]
                    continue
                if not final and (not s or any(p.startswith(s) for p in headers)):
                    self._buf = s
                    return out
                self._buf, self._state = s, _ANSWER
            else:
                return self._emit_without(buf, self._wrappers(fmt.content_suffixes), final, out)

    def _emit_without(self, buf: str, literals: tuple[str, ...], final: bool, out: list[str]) -> list[str]:
        """`buf` without `literals` onto `out`, but for a tail that may be the start of one (unless `final`)."""
        for literal in literals:
            buf = buf.replace(literal, "")
        keep = 0 if final else held_back(buf, literals)
        if len(buf) > keep:
            out.append(buf[: len(buf) - keep])
        self._buf = buf[len(buf) - keep :]
        return out

    def _wrappers(self, literals: tuple[str, ...]) -> tuple[str, ...]:
        """The answer's headers or trailers that apply here (none before a block, for a format that wraps the
        answer only after one)."""
        return literals if self._closed or self.fmt is None or not self.fmt.wrapped_after_block else ()

    def _reason(self, out: list[str], text: str) -> None:
        """Emit reasoning text; until something else than whitespace comes, it waits (whitespace-only
        reasoning is none, as llama-server discards it; trimming formats drop it anyway)."""
        if not self._said_reasoning:
            if self.fmt is not None and self.fmt.space_after_start is None:
                text = text.lstrip()
            elif not text.strip():
                self._ws += text
                return
            text, self._ws = self._ws + text, ""
        if text:
            self._said_reasoning = True
            out.append(Reasoning(text))


def split(
    fmt: ReasoningFormat | None, text: str, *, inside: bool = False, keep: bool = False, prefix: str = ""
) -> Split:
    """The reasoning and the answer of a whole output (the same machine as streaming, run once)."""
    s = Splitter(fmt, inside=inside, keep=keep, prefix=prefix)
    pieces = s.feed(text) + s.flush()
    return join(pieces)


def join(pieces: list[str]) -> Split:
    """The parts that a list of pieces adds up to."""
    reasoning = "".join(p for p in pieces if isinstance(p, Reasoning))
    content = "".join(p for p in pieces if not isinstance(p, Reasoning))
    return Split(reasoning, content)
