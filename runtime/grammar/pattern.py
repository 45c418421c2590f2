"""A string schema's "pattern" (a regular expression anchored with ^ and $) as GBNF, as llama.cpp does it.

Supported: literals, `.`, groups and non-capturing groups, alternation, character classes, `* + ?` and
`{m}`, `{m,}`, `{m,n}`. A valid expression GBNF cannot say (lookarounds, `\\d`-style shorthands, inner
anchors, an unanchored pattern) raises `UnsupportedPattern` and the converter falls back to any string;
an expression that is not valid at all raises `InvalidPattern` and the conversion fails. Characters
are handled as code points (llama.cpp walks bytes; the two agree except for a non-ASCII character
directly followed by a quantifier, which llama.cpp splits into bytes).
"""

from __future__ import annotations

from collections.abc import Callable

from runtime.errors import InvalidPattern, UnsupportedPattern
from runtime.grammar.gbnf import INT_MAX, build_repetition, gbnf_escape_length
from runtime.grammar.schema_nodes import parse_leading_int

__all__ = ["InvalidPattern", "UnsupportedPattern", "pattern_to_rule"]

_MAX_DEPTH = 100
_NON_LITERAL = frozenset("|.()[]{}*+?^$")
_ESCAPED_IN_REGEXPS_BUT_NOT_IN_LITERALS = frozenset("^$.[]()|{}*+?")
_DOT_ALL = "[\\U00000000-\\U0010FFFF]"
_DOT = "[^\\x0A\\x0D]"


# a sequence item: (text, is_literal); a literal's text is unquoted and already GBNF-escaped
_Item = tuple[str, bool]


def _to_rule(item: _Item) -> str:
    return '"' + item[0] + '"' if item[1] else item[0]


def _int(text: str) -> int:
    value = parse_leading_int(text)
    if value is None or not -(2**31) <= value < 2**31:
        raise UnsupportedPattern("invalid number in curly brackets")
    return value


class _Translator:
    def __init__(self, pattern: str, name: str, add_rule: Callable[[str, str], str], dotall: bool) -> None:
        self.sub = pattern[1:-1]
        self.name = name
        self.add_rule = add_rule
        self.dotall = dotall
        self.i = 0
        self.depth = 0
        self.sub_rule_ids: dict[str, str] = {}

    def _join(self, seq: list[_Item]) -> _Item:
        """The sequence as one rule text, consecutive literals merged into one."""
        parts: list[str] = []
        literal = ""
        for text, is_literal in seq:
            if is_literal:
                literal += text
                continue
            if literal:
                parts.append('"' + literal + '"')
                literal = ""
            parts.append(text)
        if literal:
            parts.append('"' + literal + '"')
        return " ".join(parts), False

    def transform(self) -> _Item:
        sub = self.sub
        seq: list[_Item] = []
        while self.i < len(sub):
            c = sub[self.i]
            if c == ".":
                seq.append((self.add_rule("dot", _DOT_ALL if self.dotall else _DOT), False))
                self.i += 1
            elif c == "(":
                self.i += 1
                if self.i < len(sub) and sub[self.i] == "?":
                    if self.i + 1 < len(sub) and sub[self.i + 1] == ":":
                        self.i += 2  # a non-capturing group is an ordinary group here
                    else:
                        raise UnsupportedPattern("unsupported group syntax")
                self.depth += 1
                if self.depth > _MAX_DEPTH:
                    raise UnsupportedPattern("pattern nesting too deep")
                seq.append(("(" + _to_rule(self.transform()) + ")", False))
            elif c == ")":
                self.i += 1
                if self.depth == 0:
                    raise InvalidPattern("unbalanced parentheses")
                self.depth -= 1
                return self._join(seq)
            elif c in "^$":
                raise UnsupportedPattern("anchor inside the pattern")
            elif c == "[":
                seq.append((self._char_class(), False))
            elif c == "|":
                seq.append(("|", False))
                self.i += 1
            elif c in "*+?":
                if not seq:
                    raise InvalidPattern("nothing to repeat")
                seq[-1] = (_to_rule(seq[-1]) + c, False)
                self.i += 1
            elif c == "{":
                self._repeat(seq)
            else:
                seq.append((self._literal(c), True))
        return self._join(seq)

    def _char_class(self) -> str:
        sub = self.sub
        out = "["
        self.i += 1
        while self.i < len(sub) and sub[self.i] != "]":
            if sub[self.i] == "\\":
                n = gbnf_escape_length(sub, self.i)
                if n == 0:
                    raise UnsupportedPattern("unsupported escape in character class: " + sub[self.i : self.i + 2])
                out += sub[self.i : self.i + n]
                self.i += n
            else:
                out += sub[self.i]
                self.i += 1
        if self.i >= len(sub):
            raise InvalidPattern("unterminated character class")
        self.i += 1
        return out + "]"

    def _repeat(self, seq: list[_Item]) -> None:
        sub = self.sub
        start = self.i
        self.i += 1
        while self.i < len(sub) and sub[self.i] != "}":
            self.i += 1
        if self.i >= len(sub):
            raise UnsupportedPattern("unterminated curly brackets")
        nums = sub[start + 1 : self.i].split(",")
        self.i += 1
        min_times, max_times = 0, INT_MAX
        if len(nums) == 1:
            min_times = max_times = _int(nums[0])
        elif len(nums) == 2:
            if nums[0]:
                min_times = _int(nums[0])
            if nums[1]:
                max_times = _int(nums[1])
        else:
            raise UnsupportedPattern("wrong number of values in curly brackets")
        if not seq:
            raise InvalidPattern("nothing to repeat")
        text, is_literal = seq[-1]
        if not is_literal:
            sub_id = self.sub_rule_ids.get(text)
            if sub_id is None:
                sub_id = self.add_rule(f"{self.name}-{len(self.sub_rule_ids) + 1}", text)
                self.sub_rule_ids[text] = sub_id
            text = sub_id
        seq[-1] = (build_repetition('"' + text + '"' if is_literal else text, min_times, max_times), False)

    def _literal(self, c: str) -> str:
        sub = self.sub
        n = len(sub)
        literal = ""
        while self.i < n:
            ch = sub[self.i]
            if ch == "\\":
                if self.i == n - 1:
                    raise InvalidPattern("trailing backslash")
                nxt = sub[self.i + 1]
                if nxt in _ESCAPED_IN_REGEXPS_BUT_NOT_IN_LITERALS:
                    literal += nxt
                    self.i += 2
                else:
                    k = gbnf_escape_length(sub, self.i)
                    if k == 0:
                        raise UnsupportedPattern("unsupported escape: " + sub[self.i : self.i + 2])
                    literal += sub[self.i : self.i + k]
                    self.i += k
            elif ch == '"':
                literal += '\\"'
                self.i += 1
            elif ch not in _NON_LITERAL and (
                self.i == n - 1 or not literal or sub[self.i + 1] == "." or sub[self.i + 1] not in _NON_LITERAL
            ):
                literal += ch
                self.i += 1
            else:
                break
        if not literal:  # nothing was consumed, e.g. a stray "]" or "}"
            raise UnsupportedPattern("unsupported character: " + c)
        return literal


def pattern_to_rule(
    pattern: str, name: str, add_rule: Callable[[str, str], str], *, dotall: bool = False, raw: bool = False
) -> str:
    """Add the rule for a JSON string matching `pattern` under `name`; returns the rule's name.

    `add_rule(name, body)` adds helper rules (`dot`, repeated groups); `raw` leaves out the
    surrounding JSON quotes (the rule then matches the bare text).
    """
    if len(pattern) < 2 or pattern[0] != "^" or pattern[-1] != "$":
        raise UnsupportedPattern("not anchored with '^' and '$'")
    translator = _Translator(pattern, name, add_rule, dotall)
    rule = _to_rule(translator.transform())
    if translator.depth != 0:
        raise InvalidPattern("unbalanced parentheses")
    return add_rule(name, rule if raw else '"\\"" (' + rule + ') "\\""')
