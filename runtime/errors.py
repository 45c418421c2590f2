"""Every error turnstile raises on purpose, in one place, under one base (`TurnstileError`).

Each error belongs to one category, and callers (the HTTP adapter, the CLI, an app) act on the category:

- `BadInput` (a `ValueError`): an argument, a request body, a setting or a stored document given by the caller
  is not valid; nothing was created, queued or changed.
- `NotFound` (a `LookupError`): the caller named something (a session) that does not exist.
- `Conflict`: the caller's write collides with what is stored (an id taken, a revision moved on).
- `Busy`: the runtime is too loaded to take the request now; the same request may succeed later.
- `Unavailable`: a part the request needs (the runtime, a store, the disk tier, a port) cannot be used.
- `TimedOut` (a `TimeoutError`): the request's own deadline passed; nothing was committed.
- `BadModelOutput`: the model's reply breaks the request's constraints (the model, not the caller, is at fault).
- `DataCorrupt`: stored bytes (a session record, a state, a disk record) are not what they should be.
- `EngineError`: llama.cpp failed (a model it cannot load, a decode it refused).

This module imports nothing of the project, so every package (`sessions`, `caches`, `runtime`) may use it.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BadInput",
    "BadModelOutput",
    "BindError",
    "Busy",
    "ChatTemplateError",
    "Conflict",
    "ContextOverflow",
    "DataCorrupt",
    "DiskTierUnavailable",
    "EngineError",
    "InvalidCassette",
    "InvalidConfig",
    "InvalidGrammar",
    "InvalidHistoryOp",
    "InvalidKeyFile",
    "InvalidPattern",
    "InvalidRequest",
    "InvalidSampling",
    "InvalidSession",
    "InvalidSessionId",
    "InvalidTool",
    "InvalidToolArguments",
    "LlamaDecodeError",
    "MaxStepsExceeded",
    "MissingValueFile",
    "ModelLoadError",
    "NotFound",
    "QueueFull",
    "RecordingNotFound",
    "ReplyMismatch",
    "RequestTimeout",
    "ResponseFormatError",
    "ResponseNotFound",
    "RevisionConflict",
    "RuntimeClosed",
    "SessionCorrupt",
    "SessionExists",
    "SessionNotFound",
    "StateFormatError",
    "StateLayoutError",
    "StateMismatch",
    "StateNotHeld",
    "StoreConfigError",
    "StoreUnavailable",
    "TemplateRaised",
    "TimedOut",
    "ToolCallParseError",
    "TurnstileError",
    "Unavailable",
    "UnsafeRecord",
    "UnsupportedPattern",
    "UnsupportedSchema",
]


def _show(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class TurnstileError(Exception):
    """Base of every error turnstile raises on purpose."""


# --- categories ----------------------------------------------------------------------------------------


class BadInput(TurnstileError, ValueError):
    """Raised when something the caller gave is not valid; nothing was created, queued or changed."""


class NotFound(TurnstileError, LookupError):
    """Raised when the caller names something that does not exist."""


class Conflict(TurnstileError):
    """Raised when a write collides with what is stored."""


class Busy(TurnstileError):
    """Raised when the runtime cannot take a request now; the same request may succeed later."""


class Unavailable(TurnstileError):
    """Raised when a part a request needs cannot be used (closed, unreachable, damaged, read-only)."""


class TimedOut(TurnstileError, TimeoutError):
    """Raised when a request's deadline passed; nothing was committed."""


class BadModelOutput(TurnstileError):
    """Raised when the model's reply breaks the request's constraints."""


class DataCorrupt(TurnstileError):
    """Raised when stored bytes are damaged or of a layout this build does not read."""


class EngineError(TurnstileError):
    """Raised when llama.cpp fails."""


# --- bad input -----------------------------------------------------------------------------------------


class InvalidConfig(BadInput):
    """Raised when a configuration value (a limit, a policy, an engine option, a log level) is not valid."""


class InvalidKeyFile(InvalidConfig):
    """Raised when an API key file cannot be read or has a damaged line (`line` is 1-based; 0: the file)."""

    def __init__(self, path: object, line: int, reason: str) -> None:
        self.path = str(path)
        self.line = line
        where = f"{self.path}:{line}" if line else self.path
        super().__init__(f"API key file {where}: {reason}")


class InvalidRequest(BadInput):
    """Raised before anything is queued when a request argument has the wrong type or value."""


class InvalidGrammar(InvalidRequest):
    """Raised when llama.cpp cannot run a raw GBNF grammar: it does not parse, names a token the vocabulary does not
    have, or names an end-of-generation token as a token literal (it could never match: the grammar dead-ends)."""


class InvalidSessionId(BadInput):
    """Raised when a session id is not 1 to 128 characters of `[A-Za-z0-9._:@-]`."""

    def __init__(self, session_id: object) -> None:
        super().__init__(f"invalid session id {_show(session_id)}: want 1 to 128 characters of [A-Za-z0-9._:@-]")
        self.session_id = session_id


class InvalidSampling(BadInput):
    """Raised when a sampling setting has the wrong type, is out of range, or is not a setting at all."""

    def __init__(self, field: str, value: object, reason: str) -> None:
        super().__init__(f"invalid sampling {field}={_show(value)}: {reason}")
        self.field = field
        self.value = value
        self.reason = reason


class InvalidSession(BadInput):
    """Raised when a message, session value, metadata or imported document breaks the session rules."""


class InvalidHistoryOp(BadInput):
    """Raised when a history operation's index or count does not fit the session's messages."""


class StateMismatch(BadInput):
    """Raised when a state given to the block store does not hold as many cells as the tokens given with it."""


class StoreConfigError(BadInput):
    """Raised when a store is given a bad option (a URL it cannot parse, a key prefix that is not a str)."""


class ContextOverflow(BadInput):
    """Raised before anything changes when a prompt (plus the room asked for) does not fit the context."""

    def __init__(self, n_prompt: int, n_ctx: int, room: int = 0) -> None:
        need = f"{n_prompt} prompt tokens" + (f" + {room} to generate" if room else "")
        super().__init__(f"{need} do not fit a context of {n_ctx} tokens")
        self.n_prompt = n_prompt
        self.n_ctx = n_ctx
        self.room = room


class ChatTemplateError(BadInput):
    """Raised when a chat template does not parse or refuses a conversation, or its messages or tools are malformed."""


class TemplateRaised(ChatTemplateError):
    """Raised inside a render when the template calls `raise_exception(message)` (it refuses the conversation)."""


class InvalidTool(BadInput):
    """Raised when a tool definition, a function given as a tool, or a `tool_choice` is not usable."""


class InvalidToolArguments(BadInput):
    """Raised when a tool call's arguments do not validate against the tool's parameters schema."""

    def __init__(self, tool: str, reason: str) -> None:
        super().__init__(f"invalid arguments for tool {tool!r}: {reason}")
        self.tool = tool
        self.reason = reason


class UnsupportedSchema(BadInput):
    """Raised when a JSON schema is one llama.cpp's schema-to-grammar converter rejects (or has a remote $ref)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class UnsupportedPattern(UnsupportedSchema):
    """Raised (and caught by the converter) for a valid regular expression GBNF cannot express."""


class InvalidPattern(UnsupportedSchema):
    """Raised (and turned into a conversion error) for a pattern that is not a valid regular expression."""


class ResponseFormatError(BadInput, TypeError):
    """Raised when a response format is not a msgspec Struct, dataclass or TypedDict type, a schema dict or "json"."""


# --- not found, conflicts ------------------------------------------------------------------------------


class SessionNotFound(NotFound):
    """Raised when an operation names a session id the store does not hold."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {_show(session_id)} not found")
        self.session_id = session_id


class ResponseNotFound(NotFound):
    """Raised when a Responses API call names a response id this tenant's store does not hold (never stored,
    deleted, or evicted as least recently used: `evicted` says which)."""

    def __init__(self, response_id: str, *, evicted: bool = False) -> None:
        why = "it was evicted from the response store (least recently used)" if evicted else "no such response"
        super().__init__(f"response {_show(response_id)} not found: {why}")
        self.response_id = response_id
        self.evicted = evicted


class StateNotHeld(NotFound):
    """Raised when the block store is asked for (or to release) a state it does not hold (never stored, or
    released)."""


class RecordingNotFound(NotFound):
    """Raised in replay (the pytest plugin's record mode `none`) when a test's request has no recording in its
    cassette; the message names the test and the session and shows where the prompt differs from the nearest
    recorded one."""

    def __init__(self, test: str, session_id: str, detail: str) -> None:
        super().__init__(f"no recording for {test} (session {_show(session_id)}): {detail}")
        self.test = test
        self.session_id = session_id


class SessionExists(Conflict):
    """Raised when creating, forking or importing onto an id the store already holds."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {_show(session_id)} already exists")
        self.session_id = session_id


class RevisionConflict(Conflict):
    """Raised when a write expected a revision other than the one stored (another writer came first)."""

    def __init__(self, session_id: str, expected: int, actual: int) -> None:
        super().__init__(f"session {_show(session_id)}: expected revision {expected}, stored is {actual}")
        self.session_id = session_id
        self.expected = expected
        self.actual = actual


# --- load, availability, time --------------------------------------------------------------------------


class QueueFull(Busy):
    """Raised at once when a request arrives while `max_queued` requests are already waiting."""


class RuntimeClosed(Unavailable):
    """Raised for requests made to, or still queued in, a runtime that is closing or closed."""


class StoreUnavailable(Unavailable):
    """Raised when a session store cannot be used: unreadable, read-only, damaged, full or unreachable."""

    def __init__(self, location: str, reason: str) -> None:
        super().__init__(f"session store {location} is unavailable: {reason}")
        self.location = location
        self.reason = reason


class DiskTierUnavailable(Unavailable):
    """Raised when the disk tier's directory cannot be used: read-only, not a directory, a damaged cache.db."""

    def __init__(self, directory: str, reason: str) -> None:
        super().__init__(f"disk tier {directory!r} is unavailable: {reason}")
        self.directory = directory
        self.reason = reason


class BindError(Unavailable):
    """Raised when the server cannot listen on the host and port it was given (in use, not an address here)."""

    def __init__(self, host: str, port: int, reason: str) -> None:
        super().__init__(f"cannot listen on {host}:{port}: {reason}")
        self.host = host
        self.port = port


class RequestTimeout(TimedOut):
    """Raised when a request's `timeout` passes before it finished; its session is unchanged."""


# --- the model's output --------------------------------------------------------------------------------


class ToolCallParseError(BadModelOutput):
    """Raised when model output opens a tool call that is malformed, names an unknown tool or has bad arguments."""

    def __init__(self, reason: str, text: str = "") -> None:
        super().__init__(f"cannot parse the tool call: {reason}")
        self.reason = reason
        self.text = text


class ReplyMismatch(BadModelOutput, ValueError):
    """Raised when a reply's text is not JSON or does not match the response format's schema or type."""


class MaxStepsExceeded(BadModelOutput):
    """Raised by `Runtime.run` when the model still calls tools after `max_steps` calls; carries the steps."""

    def __init__(self, max_steps: int, steps: tuple[Any, ...], last: Any) -> None:
        super().__init__(f"the model still calls tools after {max_steps} steps")
        self.max_steps = max_steps
        self.steps = steps  # the `Step`s taken
        self.last = last  # the last `Reply` (its tool calls were not run)


# --- stored data ---------------------------------------------------------------------------------------


class SessionCorrupt(DataCorrupt):
    """Raised when a stored session record cannot be read whole or decoded into a valid session."""

    def __init__(self, session_id: str, reason: str) -> None:
        super().__init__(f"session {_show(session_id)} is corrupt: {reason}")
        self.session_id = session_id
        self.reason = reason


class UnsafeRecord(DataCorrupt):
    """Raised when a stored row would have to be unpickled to be read (or written); it never is."""


class InvalidCassette(DataCorrupt):
    """Raised when a pytest-plugin cassette file is not JSON of the format the plugin writes."""


class MissingValueFile(DataCorrupt):
    """Raised when a stored row's value lives in a file beside the database and that file is missing or
    unreadable; diskcache alone would read such a row as absent, which would lose it silently."""

    def __init__(self, filename: str, reason: str) -> None:
        super().__init__(f"the value file {filename!r} of a stored row cannot be read: {reason}")
        self.filename = filename
        self.reason = reason


class StateFormatError(DataCorrupt, ValueError):
    """Raised when stored state bytes (a slot state, a disk record, a llama_cache value) are not usable;
    `reason` says why (`truncated`, `checksum`, `fingerprint` …)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class StateLayoutError(StateFormatError):
    """Raised when a llama.cpp sequence state is not the layout `caches.kvstate` knows (another llama.cpp
    version, another memory kind, damaged bytes), so it cannot be cut into blocks; it is kept whole."""


# --- llama.cpp -----------------------------------------------------------------------------------------


class ModelLoadError(EngineError):
    """Raised when a model file is missing, unreadable, not a GGUF file or rejected by llama.cpp."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"cannot load model {path!r}: {reason}")
        self.path = path
        self.reason = reason


class LlamaDecodeError(EngineError):
    """Raised when llama_decode fails: 1 no KV slot, 2 aborted, -1 bad batch, < -1 fatal."""

    def __init__(self, code: int, detail: str = "") -> None:
        meaning = {1: "no KV slot for the batch", 2: "aborted", -1: "invalid batch"}.get(
            code, "fatal error" if code < -1 else "unknown error"
        )
        super().__init__(f"llama_decode returned {code} ({meaning}){': ' + detail if detail else ''}")
        self.code = code
