"""JSON schema -> GBNF, the grammar llama.cpp (and so llama-server) builds from the same schema.

A port of llama.cpp's common/json-schema-to-grammar.cpp: same rule names, same rule bodies, rules
written in name order. `json_schema_to_grammar(schema)` equals llama.cpp's
`json_schema_to_grammar(schema, /* force_gbnf */ false)` in a build without llguidance (the default).
`SchemaConverter` keeps the shape of llama.cpp's converter (`visit`, `add_rule`, `format_grammar`) so
other grammars (tool calls) can be composed from schemas and hand-written rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runtime.errors import InvalidPattern, UnsupportedPattern, UnsupportedSchema
from runtime.grammar.gbnf import (
    INT_MAX,
    PRIMITIVE_RULES,
    SPACE_RULE,
    STRING_FORMAT_RULES,
    BuiltinRule,
    build_repetition,
    format_literal,
    is_reserved_name,
    json_dump,
    sanitize_rule_name,
)
from runtime.grammar.int_range import int_range_rule
from runtime.grammar.pattern import pattern_to_rule
from runtime.grammar.schema_nodes import (
    INT64_MAX,
    INT64_MIN,
    AllOfNode,
    AnyNode,
    AnyOfNode,
    ArrayNode,
    BooleanNode,
    ConstNode,
    EnumNode,
    IntegerNode,
    Node,
    NullNode,
    NumberNode,
    ObjectNode,
    RefNode,
    SchemaBuilder,
    StringFormat,
    StringNode,
    TupleNode,
)
from runtime.log import get_logger

__all__ = ["SchemaConverter", "json_schema_to_grammar"]

log = get_logger(__name__)

_FAILED = "JSON schema conversion failed:\n"


class SchemaConverter:
    """Builds one GBNF grammar from schemas and hand-written rules.

    `prop_order` puts the named properties first, in that order (llama.cpp's default, an empty
    mapping, keeps the schema's order). `dotall` lets "." in patterns match newlines. `raw_pattern`
    makes pattern rules match the bare text instead of a JSON string. `allow_fetch` must stay False:
    remote $refs are refused.
    """

    def __init__(
        self,
        prop_order: Mapping[str, int] | None = None,
        allow_fetch: bool = False,
        dotall: bool = False,
        raw_pattern: bool = False,
    ) -> None:
        if allow_fetch:
            raise UnsupportedSchema("fetching remote $refs is not supported (allow_fetch must be False)")
        self._prop_order = dict(prop_order or {})
        self._dotall = dotall
        self._raw_pattern = raw_pattern
        self._rules: dict[str, str] = {"space": SPACE_RULE}
        self._refs_being_resolved: set[str] = set()
        self._errors: list[str] = []
        self._warnings: list[str] = []
        self._document: Any = None
        self._url = ""

    # -- the public API -------------------------------------------------------------------------------------

    def resolve_refs(self, schema: Any, url: str = "") -> Any:
        """Make `schema` the document that "$ref"s ("#/...") in visited schemas point into; returns it.

        Refs are followed lazily, when `visit` reaches them, as llama.cpp does: an unused remote ref is
        no error, a reached one raises `UnsupportedSchema`. `url` only names the document in errors.
        """
        self._document = schema
        self._url = url
        return schema

    def visit(self, schema: Mapping[str, Any] | Node, name: str) -> str:
        """Add the rules for `schema` under `name` ("" for root); returns the name of its rule."""
        if isinstance(schema, Mapping):
            builder = SchemaBuilder(self._document if self._document is not None else schema)
            node = builder.build(schema)
        else:
            node = schema
        return self._visit(node, name)

    def add_rule(self, name: str, rule: str) -> str:
        """Add `name ::= rule`; a name taken by another body gets a number (name0, name1 ...)."""
        esc_name = sanitize_rule_name(name)
        if esc_name not in self._rules or self._rules[esc_name] == rule:
            self._rules[esc_name] = rule
            return esc_name
        i = 0
        while f"{esc_name}{i}" in self._rules and self._rules[f"{esc_name}{i}"] != rule:
            i += 1
        key = f"{esc_name}{i}"
        self._rules[key] = rule
        return key

    def check_errors(self) -> None:
        """Raise `UnsupportedSchema` if a pattern was invalid; log what was accepted loosely."""
        if self._errors:
            raise UnsupportedSchema(_FAILED + "\n".join(self._errors))
        if self._warnings:
            log.warning("grammar.schema_incomplete", warnings="; ".join(self._warnings))

    def format_grammar(self) -> str:
        """The grammar: every rule, in name order, one per line (after `check_errors`)."""
        self.check_errors()
        return "".join(f"{name} ::= {body}\n" for name, body in sorted(self._rules.items()))

    @property
    def rules(self) -> dict[str, str]:
        """A copy of the rules added so far."""
        return dict(self._rules)

    # -- visiting -------------------------------------------------------------------------------------------

    def _add_primitive(self, name: str, rule: BuiltinRule) -> str:
        n = self.add_rule(name, rule.content)
        for dep in rule.deps:
            dep_rule = PRIMITIVE_RULES.get(dep) or STRING_FORMAT_RULES.get(dep)
            if dep_rule is None:
                self._errors.append(f"Rule {dep} not known")
            elif dep not in self._rules:
                self._add_primitive(dep, dep_rule)
        return n

    def _visit_primitive(self, rule_name: str, kind: str) -> str:
        return self._add_primitive("root" if rule_name == "root" else kind, PRIMITIVE_RULES[kind])

    def _visit_pattern(self, pattern: str, name: str) -> str:
        snapshot = dict(self._rules)
        try:
            return pattern_to_rule(pattern, name, self.add_rule, dotall=self._dotall, raw=self._raw_pattern)
        except UnsupportedPattern as err:
            self._rules = snapshot
            self._warnings.append(f"pattern {pattern} is not supported ({err.reason}), accepting any string")
            return self.add_rule(name, self._add_primitive("string", PRIMITIVE_RULES["string"]))
        except InvalidPattern as err:
            self._rules = snapshot
            self._errors.append(f"Invalid pattern {pattern}: {err.reason}")
            return ""

    def _not_strings(self, strings: list[str]) -> str:
        """A JSON string that is none of `strings` (the keys of additional properties)."""
        root: dict[str, Any] = {}  # trie: char -> child; the key "" marks the end of a word
        for word in strings:
            node = root
            for ch in word:
                node = node.setdefault(ch, {})
            node[""] = {}
        char_rule = self._add_primitive("char", PRIMITIVE_RULES["char"])
        out = ['["] ( ']

        def visit(node: dict[str, Any]) -> None:
            children = sorted((k for k in node if k), key=ord)
            for j, c in enumerate(children):
                if j:
                    out.append(" | ")
                out.append(f"[{c}]")
                child = node[c]
                if any(child_key for child_key in child):
                    out.append(" (")
                    visit(child)
                    out.append(")")
                else:
                    out.append(f" {char_rule}+")
            if children:
                out.append(f' | [^"{"".join(children)}] {char_rule}*')

        visit(root)
        out.append(" )")
        if "" not in root:
            out.append("?")
        out.append(' ["]')
        return "".join(out)

    def _resolve_ref(self, ref: RefNode) -> str:
        fragment = ref.ref.split("#", 1)[1] if "#" in ref.ref else ref.ref
        ref_name = "ref" + sanitize_rule_name(fragment)
        if ref_name not in self._rules and ref.ref not in self._refs_being_resolved:
            if ref.target is None:
                self._errors.append("Unresolved $ref " + ref.ref)
                return ""
            self._refs_being_resolved.add(ref.ref)
            ref_name = self._visit(ref.target, ref_name)
            self._refs_being_resolved.discard(ref.ref)
        return ref_name

    def _object_rule(
        self,
        properties: list[tuple[str, Node]],
        required: set[str],
        name: str,
        additional: Node | None,
    ) -> str:
        prefix = name + "-" if name else ""
        if self._prop_order:
            order = self._prop_order
            ranked = sorted(enumerate(properties), key=lambda ip: (order.get(ip[1][0], len(order)), ip[0]))
            properties = [p for _, p in ranked]
        required_props: list[str] = []
        optional_props: list[str] = []
        kv_rules: dict[str, str] = {}
        names: list[str] = []
        for prop_name, prop_schema in properties:
            prop_rule = self._visit(prop_schema, prefix + prop_name)
            kv_rules[prop_name] = self.add_rule(
                prefix + prop_name + "-kv", format_literal(json_dump(prop_name)) + ' space ":" space ' + prop_rule
            )
            (required_props if prop_name in required else optional_props).append(prop_name)
            names.append(prop_name)
        if additional is not None:
            sub_name = prefix + "additional"
            value_rule = (
                self._visit(additional, sub_name + "-value")
                if not isinstance(additional, AnyNode)
                else self._add_primitive("value", PRIMITIVE_RULES["value"])
            )
            key_rule = (
                self.add_rule(sub_name + "-k", self._not_strings(names))
                if names
                else self._add_primitive("string", PRIMITIVE_RULES["string"])
            )
            kv_rules["*"] = self.add_rule(sub_name + "-kv", key_rule + ' ":" space ' + value_rule)
            optional_props.append("*")

        if not required_props and not optional_props:
            return '"{" space "}"'
        rule = '"{" space ' + ' "," space '.join(kv_rules[p] for p in required_props)
        if optional_props:
            rule += " ("
            if required_props:
                rule += ' "," space ( '

            def recursive_refs(keys: list[str], first_is_optional: bool) -> str:
                if not keys:
                    return ""
                k = keys[0]
                kv = kv_rules[k]
                comma_ref = '( "," space ' + kv + " )"
                if first_is_optional:
                    res = comma_ref + ("*" if k == "*" else "?")
                else:
                    res = kv + (" " + comma_ref + "*" if k == "*" else "")
                if len(keys) > 1:
                    res += " " + self.add_rule(prefix + k + "-rest", recursive_refs(keys[1:], True))
                return res

            rule += " | ".join(recursive_refs(optional_props[i:], False) for i in range(len(optional_props)))
            if required_props:
                rule += " )"
            rule += " )?"
        return rule + ' space "}"'

    def _visit_all_of(self, node: AllOfNode, name: str, rule_name: str) -> str:
        required: set[str] = set()
        properties: list[tuple[str, Node]] = []
        enum_values: dict[str, int] = {}

        def add_component(comp: Node, is_required: bool) -> None:
            if isinstance(comp, RefNode):
                if comp.target is not None:
                    add_component(comp.target, is_required)
            elif isinstance(comp, ObjectNode):
                for prop in comp.properties:
                    properties.append((prop.name, prop.schema))
                    if is_required:
                        required.add(prop.name)
            elif isinstance(comp, EnumNode):
                for v in comp.values:
                    literal = format_literal(json_dump(v))
                    enum_values[literal] = enum_values.get(literal, 0) + 1

        for child in node.children:
            if isinstance(child, AnyOfNode):
                for alt in child.children:
                    add_component(alt, False)
            else:
                add_component(child, True)
        if enum_values:
            common = [v for v, n in sorted(enum_values.items()) if n == len(node.children)]
            if common:
                return self.add_rule(rule_name, "(" + " | ".join(common) + ")")
        return self.add_rule(rule_name, self._object_rule(properties, required, name, None))

    def _visit(self, node: Node, name: str) -> str:
        rule_name = name + "-" if is_reserved_name(name) else name or "root"
        sub_name = name + "-" if name else ""
        if isinstance(node, RefNode):
            return self.add_rule(rule_name, self._resolve_ref(node))
        if isinstance(node, AnyOfNode):
            alt_prefix = name + "-" if name else "alternative-"
            alts = [self._visit(alt, f"{alt_prefix}{i}") for i, alt in enumerate(node.children)]
            return self.add_rule(rule_name, " | ".join(alts))
        if isinstance(node, AllOfNode):
            return self._visit_all_of(node, name, rule_name)
        if isinstance(node, ConstNode):
            return self.add_rule(rule_name, format_literal(json_dump(node.value)))
        if isinstance(node, EnumNode):
            return self.add_rule(rule_name, "(" + " | ".join(format_literal(json_dump(v)) for v in node.values) + ")")
        if isinstance(node, ObjectNode):
            if not node.properties and isinstance(node.additional_properties, AnyNode):
                return self.add_rule(rule_name, self._add_primitive("object", PRIMITIVE_RULES["object"]))
            props = [(p.name, p.schema) for p in node.properties]
            required = {p.name for p in node.properties if p.required}
            return self.add_rule(rule_name, self._object_rule(props, required, name, node.additional_properties))
        if isinstance(node, TupleNode):
            items = [self._visit(item, f"{sub_name}tuple-{i}") for i, item in enumerate(node.items)]
            return self.add_rule(rule_name, '"[" space ' + ' "," space '.join(items) + ' space "]"')
        if isinstance(node, ArrayNode):
            if isinstance(node.items, AnyNode) and node.min_items == 0 and node.max_items < 0:
                return self._visit_primitive(rule_name, "array")
            item_rule = self._visit(node.items, sub_name + "item")
            max_items = INT_MAX if node.max_items < 0 else node.max_items
            body = build_repetition(item_rule, node.min_items, max_items, '"," space')
            return self.add_rule(rule_name, '"[" space ' + body + ' space "]"')
        if isinstance(node, StringNode):
            return self._visit_string(node, rule_name)
        if isinstance(node, IntegerNode):
            if node.minimum == INT64_MIN and node.maximum == INT64_MAX:
                return self._visit_primitive(rule_name, "integer")
            return self.add_rule(rule_name, int_range_rule(node.minimum, node.maximum))
        if isinstance(node, NumberNode):
            return self._visit_primitive(rule_name, "number")
        if isinstance(node, BooleanNode):
            return self._visit_primitive(rule_name, "boolean")
        if isinstance(node, NullNode):
            return self._visit_primitive(rule_name, "null")
        return self.add_rule(rule_name, self._add_primitive("value", PRIMITIVE_RULES["value"]))

    def _visit_string(self, node: StringNode, rule_name: str) -> str:
        if node.pattern:
            return self._visit_pattern(node.pattern, rule_name)
        if node.format is StringFormat.UUID:
            return self._visit_primitive(rule_name, "uuid")
        if node.format is not StringFormat.NONE:
            prim = node.format.value + "-string"
            return self.add_rule(rule_name, self._add_primitive(prim, STRING_FORMAT_RULES[prim]))
        if node.min_length > 0 or node.max_length >= 0:
            char_rule = self._add_primitive("char", PRIMITIVE_RULES["char"])
            max_len = INT_MAX if node.max_length < 0 else node.max_length
            return self.add_rule(rule_name, '"\\"" ' + build_repetition(char_rule, node.min_length, max_len) + ' "\\""')
        return self._visit_primitive(rule_name, "string")


def json_schema_to_grammar(schema: Mapping[str, Any]) -> str:
    """The GBNF grammar llama.cpp builds for `schema` (its root rule is `root`).

    Raises `UnsupportedSchema` with llama.cpp's message for a schema llama.cpp rejects.
    """
    converter = SchemaConverter()
    converter.resolve_refs(schema, "")
    try:
        converter.visit(schema, "")
    except UnsupportedSchema as err:  # the schema reader's errors, as llama.cpp words them
        raise UnsupportedSchema(_FAILED + err.reason) from None
    return converter.format_grammar()
