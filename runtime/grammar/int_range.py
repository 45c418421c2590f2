"""GBNF for the decimal integers in a range: llama.cpp's `build_min_max_int`, rule for rule.

Bounds are int64 values with INT64_MIN / INT64_MAX meaning "no bound" (as the schema reader stores
them). Numbers are limited to 16 digits when a side is unbounded, as in llama.cpp.
"""

from __future__ import annotations

from runtime.errors import UnsupportedSchema
from runtime.grammar.schema_nodes import INT64_MAX, INT64_MIN

__all__ = ["int_range_rule"]


def int_range_rule(min_value: int, max_value: int) -> str:
    """The body of a rule matching the integers in [min_value, max_value], in parentheses."""
    out: list[str] = []
    _build(min_value, max_value, out, 16, True)
    return "(" + "".join(out) + ")"


def _digit_range(out: list[str], lo: str, hi: str) -> None:
    out.append("[" + (lo if lo == hi else lo + "-" + hi) + "]")


def _more_digits(out: list[str], min_digits: int, max_digits: int) -> None:
    out.append("[0-9]")
    if min_digits == max_digits == 1:
        return
    out.append("{" + str(min_digits))
    if max_digits != min_digits:
        out.append(",")
        if max_digits != 2**31 - 1:
            out.append(str(max_digits))
    out.append("}")


def _neg(value: int) -> int:
    """-value in int64 arithmetic (-INT64_MIN wraps to INT64_MIN, as in C++)."""
    return value if value == INT64_MIN else -value


def _prev(c: str) -> str:
    return chr(ord(c) - 1)


def _next(c: str) -> str:
    return chr(ord(c) + 1)


def _uniform_range(out: list[str], start: str, stop: str) -> None:
    """Numbers from `start` to `stop`, both written with the same number of digits."""
    i = 0
    while i < len(start) and i < len(stop) and start[i] == stop[i]:
        i += 1
    if i > 0:
        out.append('"' + start[:i] + '"')
    if i < len(start) and i < len(stop):
        if i > 0:
            out.append(" ")
        sub_len = len(start) - i - 1
        if sub_len > 0:
            from_sub = start[i + 1 :]
            to_sub = stop[i + 1 :]
            sub_zeros = "0" * sub_len
            sub_nines = "9" * sub_len
            to_reached = False
            out.append("(")
            if from_sub == sub_zeros:
                _digit_range(out, start[i], _prev(stop[i]))
                out.append(" ")
                _more_digits(out, sub_len, sub_len)
            else:
                out.append("[" + start[i] + "] (")
                _uniform_range(out, from_sub, sub_nines)
                out.append(")")
                if start[i] < _prev(stop[i]):
                    out.append(" | ")
                    if to_sub == sub_nines:
                        _digit_range(out, _next(start[i]), stop[i])
                        to_reached = True
                    else:
                        _digit_range(out, _next(start[i]), _prev(stop[i]))
                    out.append(" ")
                    _more_digits(out, sub_len, sub_len)
            if not to_reached:
                out.append(" | ")
                _digit_range(out, stop[i], stop[i])
                out.append(" ")
                _uniform_range(out, sub_zeros, to_sub)
            out.append(")")
        else:
            out.append("[" + start[i] + "-" + stop[i] + "]")


def _build(min_value: int, max_value: int, out: list[str], decimals_left: int, top_level: bool) -> None:
    has_min = min_value != INT64_MIN
    has_max = max_value != INT64_MAX

    if has_min and has_max:
        if min_value < 0 and max_value < 0:
            out.append('"-" (')
            _build(_neg(max_value), _neg(min_value), out, decimals_left, True)
            out.append(")")
            return
        if min_value < 0:
            out.append('"-" (')
            _build(0, _neg(min_value), out, decimals_left, True)
            out.append(") | ")
            min_value = 0
        min_s = str(min_value)
        max_s = str(max_value)
        for digits in range(len(min_s), len(max_s)):
            _uniform_range(out, min_s, "9" * digits)
            min_s = "1" + "0" * digits
            out.append(" | ")
        _uniform_range(out, min_s, max_s)
        return

    less_decimals = max(decimals_left - 1, 1)

    if has_min:
        if min_value < 0:
            out.append('"-" (')
            _build(INT64_MIN, _neg(min_value), out, decimals_left, False)
            out.append(") | [0] | [1-9] ")
            _more_digits(out, 0, decimals_left - 1)
        elif min_value == 0:
            if top_level:
                out.append("[0] | [1-9] ")
                _more_digits(out, 0, less_decimals)
            else:
                _more_digits(out, 1, decimals_left)
        elif min_value <= 9:
            c = str(min_value)
            range_start = "1" if top_level else "0"
            if c > range_start:
                _digit_range(out, range_start, _prev(c))
                out.append(" ")
                _more_digits(out, 1, less_decimals)
                out.append(" | ")
            _digit_range(out, c, "9")
            out.append(" ")
            _more_digits(out, 0, less_decimals)
        else:
            min_s = str(min_value)
            length = len(min_s)
            c = min_s[0]
            if c > "1":
                _digit_range(out, "1" if top_level else "0", _prev(c))
                out.append(" ")
                _more_digits(out, length, less_decimals)
                out.append(" | ")
            _digit_range(out, c, c)
            out.append(" (")
            _build(int(min_s[1:]), INT64_MAX, out, less_decimals, False)
            out.append(")")
            if c < "9":
                out.append(" | ")
                _digit_range(out, _next(c), "9")
                out.append(" ")
                _more_digits(out, length - 1, less_decimals)
        return

    if has_max:
        if max_value >= 0:
            if top_level:
                out.append('"-" [1-9] ')
                _more_digits(out, 0, less_decimals)
                out.append(" | ")
            _build(0, max_value, out, decimals_left, True)
        else:
            out.append('"-" (')
            _build(_neg(max_value), INT64_MAX, out, decimals_left, False)
            out.append(")")
        return

    raise UnsupportedSchema("At least one of min_value or max_value must be set")
