"""What a conversation is: `Message`, `Sampling` and `Session`, msgspec Structs that validate themselves.

Validation runs in `__post_init__`, so it holds for values built in code and for values decoded from
msgpack or JSON alike. Metadata is JSON-like (str keys; None, bool, int, float, str, list, dict) so that
a session survives export and import exactly.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping
from typing import Any, ClassVar, Literal, TypedDict, Unpack

import msgspec

from runtime.errors import InvalidSampling, InvalidSession, InvalidSessionId
from sessions.sampler_settings import DEFAULT_ORDER, coerce, sampler_problem
from sessions.sampler_settings import NAMES as SAMPLER_NAMES

Role = Literal["system", "user", "assistant", "tool"]
ContextPolicy = Literal["error", "window"]  # what a turn does when the history outgrows the context
CONTEXT_POLICIES = ("error", "window")

_ID = re.compile(r"[A-Za-z0-9._:@-]{1,128}")
_ROLES = frozenset({"system", "user", "assistant", "tool"})
_CALL_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_INT_MIN, _UINT_MAX = -(2**63), 2**64 - 1


def check_session_id(session_id: object) -> str:
    """Return `session_id` if it is a valid session id, else raise `InvalidSessionId`."""
    if not isinstance(session_id, str) or _ID.fullmatch(session_id) is None:
        raise InvalidSessionId(session_id)
    return session_id


class ToolCall(msgspec.Struct, frozen=True):
    """One function call the assistant made: `id` names it for the tool message that answers it."""

    id: str
    name: str
    arguments: dict[str, Any] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or _CALL_ID.fullmatch(self.id) is None:
            raise InvalidSession(f"tool call id {self.id!r} is not 1 to 128 characters of [A-Za-z0-9._:-]")
        if not isinstance(self.name, str) or _TOOL_NAME.fullmatch(self.name) is None:
            raise InvalidSession(f"tool call name {self.name!r} is not 1 to 64 characters of [a-zA-Z0-9_-]")
        check_metadata(self.arguments, f"tool call {self.id} arguments")

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI `tool_calls` entry, arguments as an object (what chat templates read)."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


class Message(msgspec.Struct, frozen=True):
    """One chat message; `created` is a Unix time in seconds.

    An assistant message may carry `tool_calls` (its `content` is then the text before the calls, often
    empty) and `reasoning` (a thinking model's reasoning, apart from its answer in `content`; "" when none,
    the default, so documents written before the field existed still decode); a `tool` message answers one
    call and must name it in `tool_call_id`.
    """

    role: Role
    content: str
    created: float = msgspec.field(default_factory=time.time)
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    reasoning: str = ""

    def __post_init__(self) -> None:
        if self.role not in _ROLES:
            raise InvalidSession(f"message role {self.role!r} is not one of system, user, assistant, tool")
        if not isinstance(self.content, str):
            raise InvalidSession(f"message content must be a str, not {type(self.content).__name__}")
        if not _is_number(self.created) or not math.isfinite(self.created):
            raise InvalidSession(f"message created time {self.created!r} is not a finite number")
        if not isinstance(self.tool_calls, tuple) or not all(isinstance(c, ToolCall) for c in self.tool_calls):
            raise InvalidSession("tool_calls must be a tuple of ToolCall")
        if self.tool_calls:
            if self.role != "assistant":
                raise InvalidSession(f"a {self.role} message cannot have tool calls")
            for call in self.tool_calls:
                call.__post_init__()  # its arguments dict may have changed in place
        if self.role == "tool":
            if not isinstance(self.tool_call_id, str) or _CALL_ID.fullmatch(self.tool_call_id) is None:
                raise InvalidSession(
                    f"a tool message needs a tool_call_id naming the call it answers, not {self.tool_call_id!r}"
                )
        elif self.tool_call_id is not None:
            raise InvalidSession(f"a {self.role} message cannot have a tool_call_id")
        if not isinstance(self.reasoning, str):
            raise InvalidSession(f"message reasoning must be a str, not {type(self.reasoning).__name__}")
        if self.reasoning and self.role != "assistant":
            raise InvalidSession(f"a {self.role} message cannot have reasoning")

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI-shaped message (tool call arguments as objects, as chat templates read them; reasoning
        as `reasoning_content`, what llama-server hands templates)."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.reasoning:
            out["reasoning_content"] = self.reasoning
        if self.tool_calls:
            out["tool_calls"] = [c.to_openai() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class Sampling(msgspec.Struct, frozen=True):
    """Sampling settings, defaulting to llama-server's; `seed=None` is random, `max_tokens=None` no limit.

    The reasoning controls are a thinking model's (`runtime.reasoning.options`) and `speculative` is the slot's
    n-gram speculation ("ngram" on, "none" off); for all of them None inherits the runtime's setting.
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False  # llama-server's ignore_eos: generate until max_tokens (benchmarks, tests)
    reasoning: str | None = None  # "auto" | "on" | "off" (llama-server's --reasoning)
    reasoning_budget: int | None = None  # tokens of reasoning, then its closer is forced (0: at once)
    reasoning_budget_message: str | None = None  # text forced before the closer when the budget is spent
    chat_template_kwargs: dict[str, Any] | None = None  # template variables (JSON-like), e.g. enable_thinking
    reasoning_format: str | None = None  # "auto" (split) | "none" (the reasoning stays in the text)
    speculative: str | None = None  # "ngram" | "none": draft-less speculation on or off (same tokens either way)
    # llama.cpp's other samplers, by llama-server's names and defaults (`sessions.sampler_settings`; each default
    # leaves the chain as it is without it)
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) pairs; a bias of -inf bans the token
    typical_p: float = 1.0
    min_keep: int = 0
    top_n_sigma: float = -1.0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    mirostat: int = 0  # 1, 2: Mirostat (1.0, 2.0) in place of the chain after the logit bias
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = 64  # the tokens DRY scans for repetitions (0: off)
    dry_sequence_breakers: tuple[str, ...] = ("\n", ":", '"', "*")
    samplers: tuple[str, ...] = DEFAULT_ORDER  # the chain's order, by llama-server's sampler names
    n_probs: int = 0  # report the n most probable tokens at each generated token (and the chosen one's)
    post_sampling_probs: bool = False  # report probabilities after the chain (else the model's, softmaxed)

    MAX_STOP: ClassVar[int] = 16
    _FLOATS: ClassVar[frozenset[str]] = frozenset(
        {"temperature", "top_p", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty"}
    )

    def __post_init__(self) -> None:
        for name in self.__struct_fields__:
            _check_sampling_field(name, getattr(self, name))

    def with_overrides(self, **overrides: Any) -> Sampling:
        """Return a copy with `overrides` applied; ints are accepted for float settings, lists for `stop`."""
        values = msgspec.structs.asdict(self)
        for name, value in overrides.items():
            if name not in values:
                raise InvalidSampling(name, value, "not a sampling setting")
            if name in self._FLOATS and _is_int(value):
                value = float(value)
            elif name == "stop" and isinstance(value, list):
                value = tuple(value)
            elif name in SAMPLER_NAMES:
                value = coerce(name, value)
            values[name] = value
        return Sampling(**values)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> Sampling:
        """Build from a mapping of settings (missing ones take the defaults); raises `InvalidSampling`."""
        if not isinstance(values, Mapping):
            raise InvalidSampling("sampling", values, "must be a mapping of settings")
        for name in values:
            if not isinstance(name, str):
                raise InvalidSampling(str(name), values[name], "not a sampling setting")
        return cls().with_overrides(**values)


def _check_sampling_field(name: str, value: Any) -> None:
    bad = _sampling_problem(name, value)
    if bad is not None:
        raise InvalidSampling(name, value, bad)


def _sampling_problem(name: str, value: Any) -> str | None:
    if name in Sampling._FLOATS:
        if not _is_number(value):
            return "must be a number"
        if not math.isfinite(value):
            return "must be finite"
        ranges = {
            "temperature": (value >= 0, "must be >= 0"),
            "top_p": (0 < value <= 1, "must be in (0, 1]"),
            "min_p": (0 <= value <= 1, "must be in [0, 1]"),
            "repeat_penalty": (value > 0, "must be > 0"),
            "presence_penalty": (-2 <= value <= 2, "must be in [-2, 2]"),
            "frequency_penalty": (-2 <= value <= 2, "must be in [-2, 2]"),
        }
        ok, why = ranges[name]
        return None if ok else why
    if name in ("top_k", "repeat_last_n"):
        if not _is_int(value):
            return "must be an int"
        low = 0 if name == "top_k" else -1
        return None if value >= low else f"must be >= {low}"
    if name == "seed":
        if value is None:
            return None
        return None if _is_int(value) and 0 <= value < 2**32 else "must be None or an int in [0, 2**32)"
    if name == "max_tokens":
        if value is None:
            return None
        return None if _is_int(value) and value >= 1 else "must be None or an int >= 1"
    if name == "ignore_eos":
        return None if isinstance(value, bool) else "must be a bool"
    if name in REASONING_CONTROLS:
        return reasoning_problem(name, value)
    if name in SAMPLER_NAMES:
        return sampler_problem(name, value)
    if name == "speculative":
        return None if value is None or value in SPECULATIVE_CHOICES else "must be None, 'ngram' or 'none'"
    if name == "stop":
        if not isinstance(value, tuple):
            return "must be a tuple (or list) of strings"
        if len(value) > Sampling.MAX_STOP:
            return f"at most {Sampling.MAX_STOP} stop strings"
        if not all(isinstance(s, str) and s for s in value):
            return "stop strings must be non-empty str"
        return None
    return "not a sampling setting"


REASONING_CONTROLS = (
    "reasoning",
    "reasoning_budget",
    "reasoning_budget_message",
    "chat_template_kwargs",
    "reasoning_format",
)
MAX_REASONING_BUDGET = 1 << 24
SPECULATIVE_CHOICES = ("ngram", "none")  # a session's or a turn's speculation (None: the runtime's)
INHERITED = (*REASONING_CONTROLS, "speculative")  # the settings whose None means "the runtime's"


def reasoning_problem(name: str, value: Any) -> str | None:
    """Why `value` is not valid for reasoning control `name` (None, "inherit", always is)."""
    if value is None:
        return None
    if name == "reasoning":
        return None if isinstance(value, str) and value in ("auto", "on", "off") else "must be 'auto', 'on' or 'off'"
    if name == "reasoning_format":
        return None if isinstance(value, str) and value in ("auto", "none") else "must be 'auto' or 'none'"
    if name == "reasoning_budget":
        ok = _is_int(value) and 0 <= value <= MAX_REASONING_BUDGET
        return None if ok else f"must be None or an int in [0, {MAX_REASONING_BUDGET}]"
    if name == "reasoning_budget_message":
        return None if isinstance(value, str) else "must be None or a str"
    if name == "chat_template_kwargs":
        if not isinstance(value, dict) or not all(isinstance(k, str) and k.isidentifier() for k in value):
            return "must be None or a dict whose keys are template variable names"
        try:
            check_metadata(value, "chat_template_kwargs")
        except InvalidSession as e:
            return str(e)
        return None
    return "not a reasoning control"


class NewSession(TypedDict, total=False):
    """What a new session may set besides its id (`Session.new`, `SessionStore.create`)."""

    system: str | None
    sampling: Sampling | Mapping[str, Any] | None
    """A `Sampling`, or a mapping of overrides."""
    metadata: Mapping[str, Any] | None
    context: ContextPolicy | None


class Session(msgspec.Struct, frozen=True, kw_only=True):
    """One conversation: the system prompt apart, then user, assistant and tool messages in order.

    Every tool call id is unique in the session, and a tool message answers a call made before it (once).

    `revision` starts at 0 and a store adds 1 on every write; `created`/`updated` are Unix times.
    """

    id: str
    system: str | None = None
    messages: tuple[Message, ...] = ()
    sampling: Sampling = msgspec.field(default_factory=Sampling)
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    created: float
    updated: float
    revision: int = 0
    context: ContextPolicy | None = None  # None: the runtime's default policy

    def __post_init__(self) -> None:
        check_session_id(self.id)
        if self.context is not None and self.context not in CONTEXT_POLICIES:
            raise InvalidSession(f"context must be None or one of {CONTEXT_POLICIES}, not {self.context!r}")
        if self.system is not None and not isinstance(self.system, str):
            raise InvalidSession(f"system prompt must be a str or None, not {type(self.system).__name__}")
        if not isinstance(self.messages, tuple):
            raise InvalidSession("messages must be a tuple of Message")
        for i, message in enumerate(self.messages):
            if not isinstance(message, Message):
                raise InvalidSession(f"messages[{i}] is not a Message")
            if message.role == "system":
                raise InvalidSession(f"messages[{i}] is a system message; the system prompt goes in `system`")
        check_tool_links(self.messages)
        if not isinstance(self.sampling, Sampling):
            raise InvalidSession("sampling must be a Sampling")
        check_metadata(self.metadata)
        for name in ("created", "updated"):
            value = getattr(self, name)
            if not _is_number(value) or not math.isfinite(value):
                raise InvalidSession(f"{name} time {value!r} is not a finite number")
        if not _is_int(self.revision) or self.revision < 0:
            raise InvalidSession(f"revision {self.revision!r} is not an int >= 0")

    @classmethod
    def new(cls, id: str, *, now: float | None = None, **fields: Unpack[NewSession]) -> Session:
        """A fresh session at revision 0, made at `now` (default: the time now); see `NewSession`."""
        check_session_id(id)
        sampling = fields.get("sampling")
        if sampling is None:
            sampling = Sampling()
        elif not isinstance(sampling, Sampling):
            sampling = Sampling.from_mapping(sampling)
        stamp = time.time() if now is None else now
        return cls(
            id=id,
            system=fields.get("system"),
            sampling=sampling,
            metadata=dict(fields.get("metadata") or {}),
            created=stamp,
            updated=stamp,
            context=fields.get("context"),
        )

    def chat_messages(self) -> list[dict[str, Any]]:
        """The OpenAI-shaped message list, with the system message first when one is set.

        Assistant tool calls come as `tool_calls: [{"id", "type": "function", "function": {"name",
        "arguments": <dict>}}]` (arguments as an object, as llama-server hands them to chat templates);
        tool messages as `{"role": "tool", "tool_call_id", "content"}`.
        """
        out: list[dict[str, Any]] = [] if self.system is None else [{"role": "system", "content": self.system}]
        out.extend(m.to_openai() for m in self.messages)
        return out


def check_tool_links(messages: tuple[Message, ...]) -> None:
    """Raise `InvalidSession` unless call ids are unique and each tool message answers one earlier call once."""
    made: set[str] = set()
    answered: set[str] = set()
    for i, message in enumerate(messages):
        for call in message.tool_calls:
            if call.id in made:
                raise InvalidSession(f"messages[{i}]: tool call id {call.id!r} is used twice")
            made.add(call.id)
        if message.role == "tool":
            cid = message.tool_call_id
            if cid not in made:
                raise InvalidSession(f"messages[{i}]: tool message answers {cid!r}, which no earlier call made")
            if cid in answered:
                raise InvalidSession(f"messages[{i}]: tool call {cid!r} is answered twice")
            answered.add(cid)


def check_metadata(value: object, path: str = "metadata") -> None:
    """Raise `InvalidSession` unless `value` is a JSON-like dict that survives export and import exactly."""
    if not isinstance(value, dict):
        raise InvalidSession(f"{path} must be a dict")
    _check_json_like(value, path)


def _check_json_like(value: object, path: str) -> None:
    if value is None or isinstance(value, bool | str):
        return
    if isinstance(value, int):
        if not _INT_MIN <= value <= _UINT_MAX:
            raise InvalidSession(f"{path}: int {value} does not fit 64 bits")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidSession(f"{path}: float {value!r} is not finite")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_json_like(item, f"{path}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidSession(f"{path}: key {key!r} is not a str")
            _check_json_like(item, f"{path}[{key!r}]")
    else:
        raise InvalidSession(
            f"{path}: {type(value).__name__} is not JSON-like (None, bool, int, float, str, list, dict)"
        )


def validate(session: Session) -> Session:
    """Re-run every check on `session`: its metadata dict may have changed in place since it was built."""
    for message in session.messages:
        message.__post_init__()
    session.sampling.__post_init__()
    session.__post_init__()
    return session
