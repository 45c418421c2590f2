"""Reading a reply written in a `ToolSyntax`, whole or as a prefix: one scanner for both.

`scan(syntax, text, tools, final)` walks the text: content up to the calls' opener, then the calls in the
family's shape, then (whitespace, or text before another opener) on. With `final=False` the text may stop
anywhere: what is fixed so far comes back (content without a possibly-partial opener or trailing
whitespace at its end; calls whose name is complete, with the canonical JSON text of their arguments so
far), so a prefix never says anything the whole text contradicts. With `final=True` a call that is not
complete or not well formed sets `error` (the caller raises `ToolCallParseError`). Nothing here raises.

Content rules: the text before the first call loses its trailing whitespace; text between calls is
stripped and joined to the content with a blank line; text after the last call is an error (the grammar
never allows it). A reply with no opener is plain content, as it is.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import assert_never

from runtime.tools.parse.gemma_calls import gemma_call
from runtime.tools.parse.harmony_calls import HEADS, drop_builtin, harmony_call, strip_header
from runtime.tools.parse.json_calls import json_call, name_json_call
from runtime.tools.parse.python_calls import pythonic_calls
from runtime.tools.parse.reader import RawCall, Reader, _Bad, _More, held_back
from runtime.tools.parse.xml_calls import xml_call
from runtime.tools.spec import Tool
from runtime.tools.syntax import shapes
from runtime.tools.syntax.shapes import ToolSyntax

__all__ = ["RawCall", "Scanned", "scan"]

_WS = " \t\r\n"


@dataclass
class Scanned:
    """What a scan found."""

    content: str
    calls: list[RawCall] = field(default_factory=list)
    error: str | None = None


_RECIPIENT = re.compile(r"[A-Za-z0-9_.:-]+\n")


def _bare_heads(syntax: ToolSyntax, tools: Sequence[Tool]) -> tuple[str, ...]:
    """Where a first call may start without the opener: `bare_open` NAME `fn_name_end` of an offered tool
    (llama-server's Qwen3-Coder handler: not any `<function`)."""
    shape = syntax.shape
    if not isinstance(shape, shapes.XmlShape) or not shape.bare_open:
        return ()
    return tuple(shape.bare_open + t.name + shape.fn_name_end for t in tools)


def _next_opener(syntax: ToolSyntax, text: str, pos: int, bare: tuple[str, ...]) -> int:
    """Where the next calls part starts at or after `pos`, -1 if none: its opener, or one of `bare`."""
    k = text.find(syntax.opener, pos)
    found = [b for h in bare if (b := text.find(h, pos, k if k >= 0 else len(text))) >= 0]
    return min(found) if found else k


def _block(r: Reader) -> None:
    """One calls part from its opener on: a section of calls, or one call."""
    s = r.s
    if not s.section_open:
        _call(r)
        return
    r.expect(s.section_open)
    while True:
        r.ws()
        if s.section_close and r.maybe(s.section_close):
            return
        if r.at_end():
            raise _More
        _call(r)
        if not s.section_close:
            r.ws()
            if r.at_end() or r.peek(s.call_open) is False:
                return


def _call(r: Reader) -> None:
    """One call (all of them for LFM2's list), read by the shape's reader."""
    match r.s.shape:
        case shapes.JsonShape() as shape:
            json_call(r, shape)
        case shapes.NameJsonShape() as shape:
            name_json_call(r, shape)
        case shapes.XmlShape() as shape:
            xml_call(r, shape)
        case shapes.HarmonyShape():
            harmony_call(r)
        case shapes.PythonicShape():
            pythonic_calls(r)
        case shapes.GemmaShape():
            gemma_call(r)
        case unknown:
            assert_never(unknown)


def scan(syntax: ToolSyntax, text: str, tools: Sequence[Tool], final: bool) -> Scanned:
    """Content and calls of `text` (see the module docstring); `final=False` for a prefix."""
    shape = syntax.shape
    harmony = isinstance(shape, shapes.HarmonyShape)
    recipient = shape.content_recipient if isinstance(shape, shapes.NameJsonShape) else ""
    xml = shape if isinstance(shape, shapes.XmlShape) else None
    head, head_start = (xml.head, xml.head_start) if xml is not None else ("", "")
    bare_open = xml.bare_open if xml is not None else ""
    bare = _bare_heads(syntax, tools)
    if recipient:  # the output starts after the opener: with a recipient
        to_all = recipient + "\n"
        if text.startswith(to_all):
            text = text[len(to_all) :]
        elif not final and to_all.startswith(text):
            return Scanned("")
        elif _RECIPIENT.match(text) or (not final and re.fullmatch(r"[A-Za-z0-9_.:-]*", text)):
            text = syntax.call_open + text
    if harmony:
        text = drop_builtin(text, final)
    r = Reader(syntax, text, tools, final)
    opener = syntax.opener
    pieces: list[str] = []
    error: str | None = None
    pos = 0
    bare_first = False  # the first call starts at `bare_open`: the content before it keeps its whitespace
    while True:
        k = _next_opener(syntax, text, pos, () if r.calls else bare)
        if k < 0:
            tail = text[pos:]
            if not final:
                heads = (opener, *HEADS) if harmony else (opener,)
                if not r.calls:
                    heads = (*heads, *bare)
                tail = tail[: len(tail) - held_back(tail, heads)]
                if head:  # a call's header being written is not content yet
                    tail = re.sub(head, "", tail)
                    tail = tail[: len(tail) - held_back(tail, (head_start,))]
                if harmony:  # a channel header still being written may become a call's
                    at = max(tail.rfind(h) for h in HEADS)
                    if at >= 0 and "<|message|>" not in tail[at:]:
                        tail = tail[:at]
            if r.calls and tail.strip():
                if final:
                    error = "text after the tool calls"
                else:
                    pieces.append(tail)
            elif not r.calls:
                pieces.append(tail)
            break
        before = text[pos:k]
        if head:
            before = re.sub(head, "", before)
        pieces.append(strip_header(before) if harmony else before)
        r.i = k
        if not r.calls and bare_open:
            bare_first = text.startswith(bare_open, k)
        try:
            _block(r)
        except _More:
            if final:
                error = "the tool call is not complete JSON or is not closed"
            break
        except _Bad as bad:
            error = str(bad.args[0])
            break
        pos = r.i
    if not r.calls and error is None:
        content = pieces[0] if pieces else ""
        if not final:
            content = content.rstrip(_WS)
        return Scanned(content)
    content = (pieces[0] if bare_first else pieces[0].rstrip(_WS)) if pieces else ""
    for piece in pieces[1:]:
        piece = piece.strip(_WS)
        if piece:
            content = f"{content}\n\n{piece}" if content else piece
    if not final:
        content = content if bare_first and len(pieces) == 1 else content.rstrip(_WS)
        # a call being written whose name is not complete yet is not shown
        calls = [c for c in r.calls if c.name]
        return Scanned(content, calls)
    return Scanned(content, r.calls, error)
