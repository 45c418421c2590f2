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

from runtime.tools.cursor import Cursor, RawCall, _Bad, _More, held_back, string_typed
from runtime.tools.families import ToolSyntax
from runtime.tools.spec import Tool

__all__ = ["RawCall", "Scanned", "held_back", "scan", "string_typed"]

_WS = " \t\r\n"
_HARMONY_HEADS = ("<|start|>", "<|channel|>")
# what a harmony call's header leaves before `to=functions.` in the answer part
_HARMONY_TAIL = re.compile(r"(?:<\|end\|>)?\s*(?:<\|start\|>assistant)?\s*(?:<\|channel\|>\w+)?\s*$")


@dataclass
class Scanned:
    """What a scan found."""

    content: str
    calls: list[RawCall] = field(default_factory=list)
    error: str | None = None


# a harmony header that names a recipient: the text's start, the role or a channel, then `to=`
_HEADER_TO = re.compile(r"(?:\A|<\|start\|>assistant|<\|channel\|>\w+)[ \t]*to=")
_FUNCTIONS = "functions."


def _drop_builtin(text: str, final: bool) -> str:
    """gpt-oss `text` without its messages to a recipient that is not `functions.*` (a builtin such as
    `container.exec` or `python`, never offered as a tool): llama-server returns them as nothing, neither
    content nor call. In a prefix, a header whose recipient may still become `functions.` ends the text."""
    out: list[str] = []
    pos = 0
    for m in _HEADER_TO.finditer(text):
        if m.start() < pos:
            continue
        k = m.end()
        j = k
        while j < len(text) and text[j] not in " \t\n<":
            j += 1
        recipient = text[k:j]
        if recipient.startswith(_FUNCTIONS):
            continue
        start = m.start() - len(_HARMONY_TAIL.search(text[: m.start()]).group(0))  # type: ignore[union-attr]
        if j == len(text) and _FUNCTIONS.startswith(recipient):
            if not final:
                out.append(text[pos:start])
                return "".join(out)
            continue
        out.append(text[pos:start])
        body = text.find("<|message|>", j)
        if body < 0:
            return "".join(out)
        ends = [(e, e + len(t)) for t in ("<|end|>", "<|call|>") if (e := text.find(t, body)) >= 0]
        if not ends:
            return "".join(out)
        pos = min(ends)[1]
    out.append(text[pos:])
    return "".join(out)


_RECIPIENT = re.compile(r"[A-Za-z0-9_.:-]+\n")


def _next_opener(syntax: ToolSyntax, text: str, pos: int, tools: Sequence[Tool], first: bool) -> int:
    """Where the next calls part starts at or after `pos`, -1 if none: its opener, or for the first call
    a bare `<function=NAME>` of an offered tool (llama-server's Qwen3-Coder handler: not any `<function`)."""
    k = text.find(syntax.opener, pos)
    if syntax.bare_open and first:
        heads = [syntax.bare_open + t.name + syntax.fn_name_end for t in tools]
        found = [b for h in heads if (b := text.find(h, pos, k if k >= 0 else len(text))) >= 0]
        if found:
            return min(found)
    return k


def scan(syntax: ToolSyntax, text: str, tools: Sequence[Tool], final: bool) -> Scanned:
    """Content and calls of `text` (see the module docstring); `final=False` for a prefix."""
    if syntax.content_recipient:  # the output starts after the opener: with a recipient
        to_all = syntax.content_recipient + "\n"
        if text.startswith(to_all):
            text = text[len(to_all) :]
        elif not final and to_all.startswith(text):
            return Scanned("")
        elif _RECIPIENT.match(text) or (not final and re.fullmatch(r"[A-Za-z0-9_.:-]*", text)):
            text = syntax.call_open + text
    if syntax.shape == "harmony":
        text = _drop_builtin(text, final)
    cur = Cursor(syntax, text, tools, final)
    opener = syntax.opener
    pieces: list[str] = []
    error: str | None = None
    pos = 0
    bare_first = False  # the first call starts at `bare_open`: the content before it keeps its whitespace
    while True:
        k = _next_opener(syntax, text, pos, tools, not cur.calls)
        if k < 0:
            tail = text[pos:]
            if not final:
                heads = (opener, *_HARMONY_HEADS) if syntax.shape == "harmony" else (opener,)
                if syntax.bare_open and not cur.calls:
                    heads = (*heads, *(syntax.bare_open + t.name + syntax.fn_name_end for t in tools))
                tail = tail[: len(tail) - held_back(tail, heads)]
                if syntax.head:  # a call's header being written is not content yet
                    tail = re.sub(syntax.head, "", tail)
                    tail = tail[: len(tail) - held_back(tail, (syntax.head_start,))]
                if syntax.shape == "harmony":  # a channel header still being written may become a call's
                    at = max(tail.rfind(h) for h in _HARMONY_HEADS)
                    if at >= 0 and "<|message|>" not in tail[at:]:
                        tail = tail[:at]
            if cur.calls and tail.strip():
                if final:
                    error = "text after the tool calls"
                else:
                    pieces.append(tail)
            elif not cur.calls:
                pieces.append(tail)
            break
        before = text[pos:k]
        if syntax.head:
            before = re.sub(syntax.head, "", before)
        pieces.append(_HARMONY_TAIL.sub("", before) if syntax.shape == "harmony" else before)
        cur.i = k
        if not cur.calls and syntax.bare_open:
            bare_first = text.startswith(syntax.bare_open, k)
        try:
            cur.block()
        except _More:
            if final:
                error = "the tool call is not complete JSON or is not closed"
            break
        except _Bad as bad:
            error = str(bad.args[0])
            break
        pos = cur.i
    if not cur.calls and error is None:
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
        calls = [c for c in cur.calls if c.name]
        return Scanned(content, calls)
    return Scanned(content, cur.calls, error)
