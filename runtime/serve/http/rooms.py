"""POST /v1/rooms: an agents room, streamed as server-sent events (the web page's Agents room).

The room is the round table (or the debate) that `turnstile demo` runs, through the same Runtime API the
examples use: each agent is a named session of the request's API key (`room-ID-NAME`, in the key's
namespace, left in place afterwards so the page can open it), and the agents speak in turn with
`Runtime.stream`. Closing the stream cancels the room: the turn in progress is withdrawn (nothing of it is
committed) and no further turn starts.

Request: {"topic", "mode": "round_table" | "debate", "agents": 1-6, "rounds": 1-5,
          "personas"?: [{"name", "system"}], "max_tokens"?: 1-512 (60), "temperature"?: (0.7), "seed"?}
Events:  room {"id", "mode", "topic", "rounds", "agents": [{"name", "session"}]}
         turn {"index", "round", "agent", "session", "message"}   an agent starts speaking
         delta {"index", "text"}                                   a piece of its reply
         done {"index", "text", "finish_reason", "stats": {...}}   its reply and the turn's numbers
         end {"turns"}                                             every turn is done
         error {"error": {...}}                                    the room stopped on an error
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from starlette.routing import Route

from runtime.api import Runtime
from runtime.cli.demo import PERSONAS, Persona, turn_message
from runtime.reply import Reply
from runtime.serve.asgi import Receive, Scope, Send
from runtime.serve.http.endpoint import ClientGone, read_body, send_error
from runtime.serve.http.errors import ApiError, to_api_error
from runtime.serve.http.live import event, stream_events
from runtime.serve.http.state import ServeState
from runtime.serve.http.tenants import Tenant, tenant_of

__all__ = ["PATHS", "RoomPlan", "plan", "routes", "turn_stats"]

PATHS = frozenset({"/v1/rooms"})
MAX_AGENTS, MAX_ROUNDS, MAX_TOKENS = len(PERSONAS), 5, 512
_NAME = re.compile(r"[A-Za-z0-9_-]{1,32}")

DEBATE = (
    Persona(
        "advocate",
        "You argue for the motion. You give clear reasons.",
        ("Argue for {topic}.", "Answer the critic and defend {topic}.", "Give your strongest reason for {topic}."),
    ),
    Persona(
        "critic",
        "You argue against the motion. You point out costs and risks.",
        (
            "Argue against {topic}.",
            "Answer the advocate: what is wrong with {topic}?",
            "Give your strongest reason against {topic}.",
        ),
    ),
    Persona(
        "judge",
        "You are a fair judge. You weigh both sides in plain words.",
        ("Which side argued better about {topic}?", "Who is winning the debate on {topic}, and why?"),
    ),
)


@dataclass(frozen=True)
class RoomPlan:
    topic: str
    mode: str
    rounds: int
    personas: tuple[Persona, ...]
    sampling: dict[str, Any]


def _int(body: dict[str, Any], name: str, default: int, lo: int, hi: int) -> int:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ApiError.bad_request(f"{name} must be an integer from {lo} to {hi}", param=name)
    return value


def plan(body: object) -> RoomPlan:
    """The room a request asks for, checked (ApiError 400 naming the field)."""
    if not isinstance(body, dict):
        raise ApiError.bad_request("the request body must be a JSON object")
    topic = body.get("topic")
    if not isinstance(topic, str) or not topic.strip() or len(topic) > 500:
        raise ApiError.bad_request("topic must be a string of 1 to 500 characters", param="topic")
    mode = body.get("mode", "round_table")
    if mode not in ("round_table", "debate"):
        raise ApiError.bad_request("mode must be 'round_table' or 'debate'", param="mode")
    base = PERSONAS if mode == "round_table" else DEBATE
    rounds = _int(body, "rounds", 2, 1, MAX_ROUNDS)
    given = body.get("personas")
    if given is not None:
        if not isinstance(given, list) or not 1 <= len(given) <= MAX_AGENTS:
            raise ApiError.bad_request(f"personas must be a list of 1 to {MAX_AGENTS} objects", param="personas")
        personas = []
        for i, p in enumerate(given):
            name = p.get("name") if isinstance(p, dict) else None
            system = p.get("system") if isinstance(p, dict) else None
            if not isinstance(name, str) or _NAME.fullmatch(name) is None:
                raise ApiError.bad_request(f"personas[{i}].name must be 1 to 32 of [A-Za-z0-9_-]", param="personas")
            if not isinstance(system, str) or not 1 <= len(system) <= 2000:
                raise ApiError.bad_request(f"personas[{i}].system must be 1 to 2000 characters", param="personas")
            asks = base[i % len(base)].asks
            personas.append(Persona(name, system, asks))
        if len({p.name for p in personas}) != len(personas):
            raise ApiError.bad_request("persona names must differ", param="personas")
        chosen = tuple(personas)
    else:
        chosen = base[: _int(body, "agents", 3, 1, len(base))]
    sampling: dict[str, Any] = {"max_tokens": _int(body, "max_tokens", 60, 1, MAX_TOKENS), "repeat_penalty": 1.1}
    temperature = body.get("temperature", 0.7)
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) or not 0 <= temperature <= 2:
        raise ApiError.bad_request("temperature must be a number from 0 to 2", param="temperature")
    sampling["temperature"] = float(temperature)
    if body.get("seed") is not None:
        sampling["seed"] = _int(body, "seed", 0, 0, 2**31 - 1)
    return RoomPlan(topic.strip(), mode, rounds, chosen, sampling)


def turn_stats(reply: Reply) -> dict[str, Any]:
    """A turn's numbers for the page's bar: tokens, where the state came from, times (ms) and speeds."""
    u, t = reply.usage, reply.timings
    return {
        "prompt": u.prompt_tokens,
        "cached": u.cached_tokens,
        "prefilled": u.prefilled_tokens,
        "generated": u.generated_tokens,
        "source": reply.cache_source,
        "queued_ms": t.queued * 1000,
        "ttft_ms": (t.queued + t.first_token) * 1000 if t.first_token is not None else None,
        "prefill_per_second": u.prefilled_tokens / t.prefill if t.prefill > 0 else 0.0,
        "decode_per_second": u.generated_tokens / t.decode if t.decode > 0 else 0.0,
        "draft_n": u.draft_n,
        "draft_n_accepted": u.draft_n_accepted,
    }


async def _create(rt: Runtime, tenant: Tenant, room: str, room_plan: RoomPlan) -> list[tuple[Persona, str, str]]:
    """Each agent's session (client id, internal id), created with its persona and the room's sampling."""
    out = []
    for p in room_plan.personas:
        client_id = f"room-{room}-{p.name}"
        sid = tenant.session_id(client_id)
        await rt.create_session(sid, system=p.system, **room_plan.sampling)
        out.append((p, client_id, sid))
    return out


async def _run(
    rt: Runtime, room: str, room_plan: RoomPlan, agents: list[tuple[Persona, str, str]]
) -> AsyncGenerator[bytes, None]:
    yield event(
        "room",
        {
            "id": room,
            "mode": room_plan.mode,
            "topic": room_plan.topic,
            "rounds": room_plan.rounds,
            "agents": [{"name": p.name, "session": cid} for p, cid, _ in agents],
        },
    )
    heard: dict[str, list[tuple[str, str]]] = {p.name: [] for p, _, _ in agents}
    index = 0
    for rnd in range(1, room_plan.rounds + 1):
        for p, client_id, sid in agents:
            message = turn_message(room_plan.topic, p, rnd, heard[p.name])
            heard[p.name] = []
            yield event(
                "turn", {"index": index, "round": rnd, "agent": p.name, "session": client_id, "message": message}
            )
            reply: Reply | None = None
            async for item in rt.stream(sid, message):
                if isinstance(item, Reply):
                    reply = item
                elif isinstance(item, str) and item:
                    yield event("delta", {"index": index, "text": item})
            assert reply is not None
            yield event(
                "done",
                {"index": index, "text": reply.text, "finish_reason": reply.finish_reason, "stats": turn_stats(reply)},
            )
            for other, _, _ in agents:
                if other is not p:
                    heard[other.name].append((p.name, reply.text))
            index += 1
    yield event("end", {"turns": index})


class Rooms:
    """POST /v1/rooms (an ASGI app for one route)."""

    def __init__(self, state: ServeState, *, max_body_bytes: int) -> None:
        self.state = state
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            raw = await read_body(scope, receive, self.max_body_bytes)
            try:
                body = json.loads(raw) if raw.strip() else None
            except ValueError:
                raise ApiError.bad_request("the request body is not JSON") from None
            room_plan = plan(body)
            tenant = tenant_of(scope)
            rt = self.state.require()
            room = secrets.token_hex(3)
            agents = await _create(rt, tenant, room, room_plan)  # before the 200: a full queue is a 429
        except ClientGone:
            return
        except Exception as e:
            await send_error(send, to_api_error(e))
            return
        await stream_events(receive, send, _run(rt, room, room_plan, agents))


def routes(state: ServeState, *, max_body_bytes: int) -> list[Route]:
    return [Route("/v1/rooms", Rooms(state, max_body_bytes=max_body_bytes), methods=["POST"])]
