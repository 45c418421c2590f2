"""The GBNF rule for one call of one tool, shape by shape (`runtime.tools.grammar.syntax` puts them together).

Arguments are the tool's JSON schema; in the XML shape each parameter is a tagged value: a string parameter is
any text up to its closer (the closer cannot occur inside it), any other is JSON of its schema; the parameters
come in schema order, the required ones always, the others optionally (llama-server's XML grammars do the same).
"""

from __future__ import annotations

from typing import Any

from runtime.grammar.chat import reasoning_rules
from runtime.tools.grammar.builder import GrammarBuilder, gbnf_literal
from runtime.tools.spec import Tool, string_typed
from runtime.tools.syntax.shapes import JsonShape, NameJsonShape, ToolSyntax, XmlShape

__all__ = ["gemma_call", "harmony_call", "json_call", "lit", "name_json_call", "pythonic_call", "seq", "xml_call"]


def lit(text: str) -> str:
    """`text` as a GBNF literal, "" for no text."""
    return gbnf_literal(text) if text else ""


def seq(*parts: str) -> str:
    """The parts that are not empty, in sequence."""
    return " ".join(p for p in parts if p)


def _properties(b: GrammarBuilder, tool: Tool) -> tuple[dict[str, Any], set[str]]:
    """The tool's parameters (in its schema made the builder's document) and the required ones."""
    doc = b.document(tool.parameters)
    props = doc.get("properties") if isinstance(doc.get("properties"), dict) else {}
    assert isinstance(props, dict)
    return props, set(doc.get("required", []))


def json_call(b: GrammarBuilder, s: JsonShape, tool: Tool) -> str:
    """One call object: the name as a const, the arguments as the tool's schema, the id where the shape has one."""
    params = b.document(tool.parameters)
    if s.name_is_key:
        schema = {"type": "object", "properties": {tool.name: params}, "required": [tool.name]}
        return b.visit(f"{tool.name}-call", schema)
    props: dict[str, Any] = {}
    required: list[str] = []
    # an id with a fixed shape is one the template insists on (Mistral Nemo); others are optional
    id_schema: dict[str, Any] = {"type": "string", **({"pattern": s.id_pattern} if s.id_pattern else {})}
    if s.id_key and s.id_first:
        props[s.id_key] = id_schema
        required.append(s.id_key)
    props[s.name_key] = {"const": tool.name}
    props[s.args_key] = params
    required += [s.name_key, s.args_key]
    if s.id_key and not s.id_first:
        props[s.id_key] = id_schema
        if s.id_pattern:
            required.append(s.id_key)
    return b.visit(f"{tool.name}-call", {"type": "object", "properties": props, "required": required})


def name_json_call(b: GrammarBuilder, syntax: ToolSyntax, s: NameJsonShape, tool: Tool, *, opener: bool = True) -> str:
    """The name as text, then the arguments as the tool's schema; `opener=False`: without `call_open`."""
    args = b.visit(f"{tool.name}-args", b.document(tool.parameters))
    name = lit(s.name_prefix + tool.name) + (' ":" [0-9]+' if s.name_index else "")
    call_id = ""
    if s.id_open:
        id_rule = "[a-zA-Z0-9]{9}" if syntax.id_style == "mistral" else "[^\\x5B]+"
        call_id = seq(lit(s.id_open), b.rule("call-id", id_rule))
    before = seq(b.rule("call-id-before", "[^<]+"), lit(s.id_before)) if s.id_before else ""
    body = seq(lit(syntax.call_open) if opener else "", before, name, call_id, lit(s.name_close), lit(s.args_open))
    body = seq(body, args, "space", lit(s.args_close), lit(syntax.call_close))
    return b.rule(f"{tool.name}-call" if opener else f"{tool.name}-first-call", body)


def xml_call(b: GrammarBuilder, syntax: ToolSyntax, s: XmlShape, tool: Tool) -> str:
    """The tagged function and its parameters in schema order (the required ones always): a string parameter is
    any text up to its closer, any other JSON of its schema."""
    props, required = _properties(b, tool)
    string_rule = ""
    parts: list[str] = []
    for key, spec in props.items():
        if string_typed(tool, key):
            if not string_rule:
                for rule, body in reasoning_rules(s.param_close, "xml-string").items():
                    b.rule(rule, body)
                string_rule = "xml-string"
            value = string_rule  # any text, then the closer
        else:
            value = seq("space", b.visit(f"{tool.name}-{key}", spec), "space", lit(s.param_close))
        if s.param_close_named:
            value = seq(value, lit(key + s.param_name_end))
        value_open = seq("space", lit(s.value_open)) if s.value_open else ""
        typed = s.param_typed[0 if string_typed(tool, key) else 1]
        param = seq("space", lit(s.param_open + key + typed + s.param_name_end), value_open, value)
        rule = b.rule(f"{tool.name}-{key}-param", param)
        parts.append(rule if key in required else f"{rule}?")
    name_end = lit(s.fn_name_end) if s.fn_name_end else '"\\n"?'
    if s.fn_head_end:
        name_end = seq(name_end, "[^<]*", lit(s.fn_head_end))
    opener = f"( {lit(syntax.call_open)} space )?" if s.bare_open else seq(lit(syntax.call_open), "space")
    body = seq(s.head_gbnf, opener, lit(s.fn_open + tool.name), name_end, *parts, "space")
    body = seq(body, lit(s.fn_close), "space" if s.fn_close else "", lit(syntax.call_close))
    return b.rule(f"{tool.name}-call", body)


def pythonic_call(b: GrammarBuilder, tool: Tool) -> str:
    """LFM2: NAME(key=value, ...), the required keys in schema order, then the optional ones; values as JSON
    of their schema, except booleans and null in Python's spelling."""
    props, needed = _properties(b, tool)
    required = [k for k in props if k in needed]
    optional = [k for k in props if k not in required]
    params: dict[str, str] = {}
    for key in props:
        spec = props[key]
        kind = spec.get("type") if isinstance(spec, dict) else None
        if kind == "boolean":
            value = '( "True" | "False" )'
        elif kind == "null":
            value = '"None"'
        elif string_typed(tool, key) and "enum" not in spec and "const" not in spec:
            json_string = b.visit(f"{tool.name}-{key}", spec)
            quoted = b.rule("py-string", '"\'" ( [^\'\\\\\\x00-\\x1F] | "\\\\" [^\\x00-\\x1F] )* "\'"')
            value = f"( {json_string} | {quoted} )"
        else:
            value = b.visit(f"{tool.name}-{key}", spec)
        params[key] = b.rule(f"{tool.name}-{key}-kw", f"{gbnf_literal(key + '=')} {value}")
    sep = '"," space'
    if required:
        body = f" {sep} ".join(params[k] for k in required) + "".join(f" ( {sep} {params[k]} )?" for k in optional)
    elif optional:
        body = (
            "( ( "
            + " | ".join(params[k] for k in optional)
            + f" ) ( {sep} ( "
            + " | ".join(params[k] for k in optional)
            + " ) )* )?"
        )
    else:
        body = ""
    return b.rule(f"{tool.name}-call", seq(gbnf_literal(tool.name + "("), body, '")"'))


def gemma_call(b: GrammarBuilder, syntax: ToolSyntax, tool: Tool) -> str:
    """Gemma 4: NAME{key:value,...} with the keys sorted (its template's `dictsort`), the required ones always;
    strings in `<|"|>` quotes, booleans bare, anything else JSON of its schema."""
    props, required = _properties(b, tool)
    keys = sorted(props)
    items: list[str] = []
    for key in keys:
        spec = props[key]
        kind = spec.get("type") if isinstance(spec, dict) else None
        if string_typed(tool, key) and "enum" not in spec and "const" not in spec:
            for rule, body in reasoning_rules('<|"|>', "gemma-string").items():
                b.rule(rule, body)
            value = '"<|\\"|>" gemma-string'
        elif kind == "boolean":
            value = '( "true" | "false" )'
        else:
            value = b.visit(f"{tool.name}-{key}", spec)
        items.append(b.rule(f"{tool.name}-{key}-kv", f"{gbnf_literal(key + ':')} {value}"))
    first, rest = "", ""  # the keys from i on, with nothing / something written before
    for i in range(len(keys) - 1, -1, -1):
        tail_rest, tail_first = rest, first
        with_item_rest = seq('","', items[i], tail_rest)
        with_item_first = seq(items[i], tail_rest)
        if keys[i] in required:
            rest = b.rule(f"{tool.name}-rest-{i}", with_item_rest)
            first = b.rule(f"{tool.name}-first-{i}", with_item_first)
        else:
            rest = b.rule(
                f"{tool.name}-rest-{i}",
                f"( {with_item_rest} )?" if not tail_rest else f"( {with_item_rest} ) | {tail_rest}",
            )
            alt = f" | {tail_first}" if tail_first else ""
            first = b.rule(
                f"{tool.name}-first-{i}", f"( {with_item_first} ){alt}" if alt else f"( {with_item_first} )?"
            )
    return b.rule(
        f"{tool.name}-call", seq(lit(syntax.call_open + tool.name + "{"), first, '"}"', lit(syntax.call_close))
    )


def harmony_call(b: GrammarBuilder, syntax: ToolSyntax, tool: Tool) -> str:
    """gpt-oss: the recipient, then the channel header its template writes, then the JSON arguments."""
    args = b.visit(f"{tool.name}-args", b.document(tool.parameters))
    head = (
        lit(syntax.call_open + tool.name) + ' "<|channel|>commentary" ( " json" | " <|constrain|>json" )? "<|message|>"'
    )
    return b.rule(f"{tool.name}-call", seq(head, args))
