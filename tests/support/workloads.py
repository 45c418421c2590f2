"""Conversations that tests and benchmarks both play: six personas with five user turns each, in the
round-robin order of the parity oracle and the interleaved benchmark."""

from __future__ import annotations

from typing import Any

Messages = list[dict[str, str]]

# (system prompt, user messages): six personas with five turns each (those of the parity oracle).
PERSONAS: list[tuple[str, list[str]]] = [
    (
        "You are a cheerful chef. Answer in one or two sentences.",
        [
            "How do I boil an egg?",
            "How long for a soft yolk?",
            "What can I serve it with?",
            "Is brown bread better?",
            "Any tip for peeling it?",
        ],
    ),
    (
        "You are a patient astronomy teacher. Keep your answers short.",
        [
            "Why is the sky blue?",
            "What is a light year?",
            "Name a planet with rings.",
            "How far away is the Moon?",
            "What is a comet made of?",
        ],
    ),
    (
        "You are a terse Python programmer.",
        [
            "What is a list comprehension?",
            "Show me one example.",
            "When should I avoid it?",
            "What about generators?",
            "How do I time my code?",
        ],
    ),
    (
        "You are a friendly travel guide for Europe. Answer briefly.",
        [
            "What should I see in Paris?",
            "Is the metro easy to use?",
            "Where can I eat cheaply?",
            "Is it safe at night?",
            "What about a day trip?",
        ],
    ),
    (
        "You are a calm gardening expert.",
        [
            "When should I plant tomatoes?",
            "How often do I water them?",
            "Why are the leaves yellow?",
            "Can I grow them indoors?",
            "What is a good fertiliser?",
        ],
    ),
    (
        "You are a concise history tutor.",
        [
            "Who built the pyramids?",
            "How long did it take?",
            "What tools did they use?",
            "Who was Cleopatra?",
            "When did Rome fall?",
        ],
    ),
]


def persona(conv: int) -> tuple[str, list[str]]:
    """Conversation `conv`'s system prompt and user messages (beyond the sixth: numbered variants)."""
    system, users = PERSONAS[conv % len(PERSONAS)]
    if conv < len(PERSONAS):
        return system, users
    return f"{system} You are assistant number {conv}.", users


def user_message(conv: int, turn: int) -> str:
    users = persona(conv)[1]
    msg = users[turn % len(users)]
    return msg if turn < len(users) else f"{msg} (again, {turn // len(users)})"


def schedule(n_conv: int, n_turn: int, first_turn: int = 0) -> list[tuple[int, int]]:
    """Round robin: A1 B1 C1 … A2 B2 … (turns first_turn .. first_turn + n_turn - 1)."""
    return [(c, t) for t in range(first_turn, first_turn + n_turn) for c in range(n_conv)]


def messages(conv: int, turn: int, replies: dict[tuple[int, int], str]) -> Messages:
    """Conversation `conv` at `turn`: its system prompt, its earlier turns, the new user message."""
    system = persona(conv)[0]
    msgs = [{"role": "system", "content": system}]
    for t in range(turn):
        msgs += [{"role": "user", "content": user_message(conv, t)}, {"role": "assistant", "content": replies[conv, t]}]
    msgs.append({"role": "user", "content": user_message(conv, turn)})
    return msgs


# Prompts with the JSON schemas their replies must follow (nested objects, arrays, enums, optional fields,
# bounded numbers): the structured-output oracle and the grammar benchmark.
STRUCTURED_PROMPTS: list[tuple[str, dict[str, Any]]] = [
    (
        "Describe a fictional person.",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "address": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                    "required": ["city"],
                },
            },
            "required": ["name", "address"],
        },
    ),
    (
        "List three fruits.",
        {
            "type": "object",
            "properties": {"fruits": {"type": "array", "items": {"type": "string"}, "minItems": 3, "maxItems": 3}},
            "required": ["fruits"],
        },
    ),
    (
        "Is the sky blue? Answer with a verdict.",
        {"type": "object", "properties": {"verdict": {"enum": ["yes", "no", "unsure"]}}, "required": ["verdict"]},
    ),
    (
        "Give a book title, and its year if you know it.",
        {
            "type": "object",
            "properties": {"title": {"type": "string"}, "year": {"type": "integer"}},
            "required": ["title"],
        },
    ),
    (
        "Rate pizza from 1 to 10 and give a temperature in Celsius.",
        {
            "type": "object",
            "properties": {
                "rating": {"type": "integer", "minimum": 1, "maximum": 10},
                "celsius": {"type": "number", "minimum": -50, "maximum": 60},
            },
            "required": ["rating", "celsius"],
        },
    ),
]
