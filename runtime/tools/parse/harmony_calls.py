"""gpt-oss's harmony recipients (`HarmonyShape`): a call is the message to `functions.NAME`, its arguments
JSON; messages to a builtin recipient are dropped; the header text around a call is not content."""

from __future__ import annotations

import re

from runtime.tools.parse.reader import RawCall, Reader, _Bad, _More

__all__ = ["HEADS", "drop_builtin", "harmony_call", "strip_header"]

HEADS = ("<|start|>", "<|channel|>")  # what may begin a header that becomes a call's
# what a harmony call's header leaves before `to=functions.` in the answer part
_TAIL = re.compile(r"(?:<\|end\|>)?\s*(?:<\|start\|>assistant)?\s*(?:<\|channel\|>\w+)?\s*$")
# a harmony header that names a recipient: the text's start, the role or a channel, then `to=`
_HEADER_TO = re.compile(r"(?:\A|<\|start\|>assistant|<\|channel\|>\w+)[ \t]*to=")
_FUNCTIONS = "functions."


def strip_header(before: str) -> str:
    """The text before a call without the header that leads to its recipient."""
    return _TAIL.sub("", before)


def drop_builtin(text: str, final: bool) -> str:
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
        start = m.start() - len(_TAIL.search(text[: m.start()]).group(0))  # type: ignore[union-attr]
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


def harmony_call(r: Reader) -> None:
    """`to=functions.NAME`, the rest of the channel header, `<|message|>`, the JSON arguments, then `<|call|>`
    (or the end of the text, where `<|call|>` stopped generation)."""
    r.expect("to=functions.")
    name, _ = r.until("<|message|>")
    name = name.strip()
    name = name.split("<|channel|>")[0].split("<|constrain|>")[0].split()[0] if name.strip() else ""
    if not name or any(c in name for c in "<>{}\"'"):
        raise _Bad(f"bad tool name {name!r}")
    call = RawCall(name)
    r.calls.append(call)
    r.json_arguments(call)
    r.ws()
    if r.at_end():  # `<|call|>` is a stop: the text ends with the arguments
        return
    for end in ("<|call|>", "<|end|>"):
        if r.peek(end) is None:
            raise _More
        if r.maybe(end):
            break
