"""What a turn returns: the reply text, why it ended, token usage, timings and where its state came from."""

from __future__ import annotations

from typing import Any

import msgspec

from runtime.types import CacheSource, FinishReason
from sessions.model import ToolCall


class Usage(msgspec.Struct, frozen=True):
    """Token counts; `cached_tokens` and `prefilled_tokens` are llama-server's `cache_n` and `prompt_n`."""

    prompt_tokens: int
    cached_tokens: int
    prefilled_tokens: int
    generated_tokens: int  # an end-of-generation token included, as llama-server counts
    dropped_messages: int = 0  # messages of the conversation the prompt left out (context "window")
    draft_n: int = 0  # tokens drafted by n-gram speculation (llama-server's draft_n)
    draft_n_accepted: int = 0  # of those, accepted (each one a decode step saved)
    # prompt tokens evaluated in prefill chunks aborted for another request (policy "fair"), evaluated again
    # later: not in `prefilled_tokens`, which counts what the slot kept
    aborted_tokens: int = 0


class Timings(msgspec.Struct, frozen=True):
    """Seconds spent waiting in the queue, on cache work, in prefill and in decode (and, paused by the fair
    policy, back in the queue after the prefill had started: part of `total`, not of `queued`)."""

    queued: float
    cache: float
    prefill: float
    decode: float
    first_token: float | None  # from the start of the run to the first generated token
    total: float  # from the request to its reply
    paused: float = 0.0  # seconds its prefill spent paused for other requests (policy "fair")
    aborted: float = 0.0  # of `prefill`, seconds of work in chunks aborted for other requests (thrown away)


class ToolCallDelta(msgspec.Struct, frozen=True):
    """A streamed piece of a tool call (`rt.stream` yields them between the text pieces when tools are offered).

    The first piece of call `index` (0, 1, ... in the reply's order) carries its `id` and `name` and no
    arguments; the next ones carry only `arguments_delta`. The deltas of a call add up to its arguments as JSON
    text, `json.dumps(call.arguments, ensure_ascii=False)`, and the final Reply's `tool_calls[index]` has the
    same id and name: the pieces always add up to the Reply (OpenAI's `delta.tool_calls`).
    """

    index: int
    id: str = ""
    name: str = ""
    arguments_delta: str = ""


class Started(msgspec.Struct, frozen=True):
    """The slot started the turn: its prompt is tokenized and fits, `cached_tokens` of it are reused and the
    rest is about to be prefilled. Only `Runtime.complete_stream_started` yields it (first), so
    that a server can answer before a long prefill ends (Anthropic's `message_start`, keep-alives)."""

    prompt_tokens: int
    cached_tokens: int


class Progress(Started, frozen=True):
    """How far the prefill is (llama-server's `prompt_progress`): `processed` of the prompt's tokens are in the
    slot (the cached ones first, then one report per n_batch chunk), `seconds` since the slot started the turn.
    Only a stream asked for with prefill progress yields it (a `Started`, so a relay that does not want it skips it)."""

    processed: int = 0
    seconds: float = 0.0


class Step(msgspec.Struct, frozen=True):
    """One tool call of an agent run and the result that went back to the model."""

    call: ToolCall
    result: str
    error: bool = False  # the function raised; `result` is its error text


class Candidate(msgspec.Struct, frozen=True):
    """One of the most probable tokens at a generated position: its id, bytes and probability."""

    token: int
    piece: bytes  # the token's bytes (special tokens as text only when the reply shows them)
    p: float


class TokenProb(msgspec.Struct, frozen=True):
    """A generated token with its probability and the `n_probs` most probable tokens at its position
    (`Sampling.n_probs`): the model's softmax, or after the sampler chain with `post_sampling_probs`.
    `text` is what the token added to the reply as llama-server counts it (empty while a stop string may begin,
    the held text then comes with the token that releases it; an end-of-generation token adds nothing)."""

    token: int
    text: str
    piece: bytes
    p: float
    top: tuple[Candidate, ...]


class ProbText(str):
    """A streamed piece of text with the probabilities of the tokens that made it (`Sampling.n_probs`)."""

    probs: tuple[TokenProb, ...] = ()

    def __new__(cls, text: str, probs: tuple[TokenProb, ...] = ()) -> ProbText:
        out = super().__new__(cls, text)
        out.probs = probs
        return out


class Reply(msgspec.Struct, frozen=True):
    """One assistant turn: `text` is the answer alone; a thinking model's reasoning is in `reasoning`."""

    session_id: str
    request_id: int
    text: str
    finish_reason: FinishReason
    usage: Usage
    cache_source: CacheSource
    timings: Timings
    revision: int  # the session's revision after this turn was committed (unchanged if cancelled)
    parsed: Any = None  # structured output: the decoded, validated reply (None if cut by max_tokens)
    tool_calls: tuple[ToolCall, ...] = ()  # finish_reason "tool_calls": the calls the model made
    steps: tuple[Step, ...] = ()  # `Runtime.run`: the tool calls made on the way, with their results
    reasoning: str = ""  # the reasoning ("thinking") before the answer; "" when none
    stop_sequence: str | None = None  # the stop string that ended the reply (finish "stop"); None: EOS or other
    tokens: tuple[int, ...] = ()  # `Runtime.complete_prompt`: the generated token ids (empty for other turns)
    probs: tuple[TokenProb, ...] = ()  # each generated token's probabilities, when the turn asked (`n_probs`)
