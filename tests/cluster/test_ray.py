"""Two turnstile replicas on a local Ray instance (started here) behind one endpoint, sessions in a real
redis-server: each conversation stays on the replica that holds its state, and a replica killed mid-run
loses no conversation and no acknowledged turn while Ray replaces it.

Deselect with `-m "not ray"`. One Ray instance serves the module (about a minute on two cores).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
import ray
from ray.serve._private.common import DeploymentID
from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE
from ray.serve._private.long_poll import LongPollNamespace

import runtime
from runtime.serve.cluster import ray as cluster
from runtime.serve.cluster.affinity import conversation_key, order
from sessions.redis import RedisStore
from tests.support.redis_server import RedisServer, free_port, running_redis

pytestmark = pytest.mark.ray

APP = "turnstile"
PREFIX = f"SERVE_REPLICA::{APP}#{cluster.REPLICA}#"
HEADER = "x-turnstile-replica"


@dataclass
class Cluster:
    url: str
    redis: RedisServer
    client: httpx.Client


@pytest.fixture(scope="module")
def served(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("ray")
    with running_redis(root / "redis") as redis:
        options = {"model": tiny_llama, "n_ctx": 1024, "n_threads": 1, "data_dir": root / "states"}
        app = cluster.application(options, replicas=2, session_store=redis.url, num_cpus_per_replica=1)
        url = cluster.start(app, port=free_port(), num_cpus=4, name=APP)
        try:
            with httpx.Client(base_url=url, timeout=120) as client:
                yield Cluster(url, redis, client)
        finally:
            cluster.stop(APP)


def test_ray_workers_are_given_the_directory_that_holds_runtime() -> None:
    """`start` puts this directory first on the workers' PYTHONPATH: `runtime/` itself there would shadow the
    standard library with `runtime/types.py` and every worker would die at startup."""
    assert Path(cluster._ROOT) == Path(runtime.__file__).resolve().parent.parent


def replicas() -> set[str]:
    """The ids of the live replica actors."""
    names = ray.util.list_named_actors(all_namespaces=True)
    return {n["name"][len(PREFIX) :] for n in names if n["name"].startswith(PREFIX)}


def running_replicas_once(condition: Callable[[set[str]], bool], timeout: float) -> set[str]:
    """The ids of the replicas Ray Serve runs, once `condition` holds of them. Waits on Serve's own long poll
    (the controller answers a `listen_for_change` when the deployment's running replicas change, the same
    broadcast every router gets), so nothing sleeps; `timeout` bounds the whole wait."""
    controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
    key = (LongPollNamespace.DEPLOYMENT_TARGETS, DeploymentID(name=cluster.REPLICA, app_name=APP))
    snapshot, ids = -1, set[str]()  # -1: no snapshot yet, the first answer is the current one
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        assert left > 0, f"the running replicas were still {sorted(ids)} after {timeout} s"
        answer = ray.get(controller.listen_for_change.remote({key: snapshot}), timeout=left)
        if isinstance(answer, dict) and key in answer:  # otherwise the poll timed out with no change: ask again
            snapshot = answer[key].snapshot_id
            ids = {r.replica_id.unique_id for r in answer[key].object_snapshot.running_replicas}
            if condition(ids):
                return ids


def transcript(served: Cluster, c: Conversation) -> list[dict[str, str]]:
    """A named conversation as Redis holds it, in the client's shape."""
    store = RedisStore.from_url(served.redis.url)
    try:
        session = store.get(c.session or "")
    finally:
        store.close()
    head = [{"role": "system", "content": session.system}] if session.system is not None else []
    return head + [{"role": m.role, "content": m.content} for m in session.messages]


def first_choice(key: str, ids: set[str]) -> str:
    return order(key, dict.fromkeys(ids, 0))[0]


@dataclass
class Conversation:
    """A client's view of one conversation: it resends its whole history each turn."""

    system: str
    session: str | None = None
    messages: list[dict[str, str]] = field(default_factory=list)
    replicas: list[str] = field(default_factory=list)
    usage: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.messages = [{"role": "system", "content": self.system}]

    @property
    def key(self) -> str:
        return f"session:{self.session}" if self.session else conversation_key([*self.messages[:1], _user(0)])

    def request(self, turn: int, **extra: Any) -> tuple[dict[str, Any], dict[str, str]]:
        body = {"messages": [*self.messages, _user(turn)], "max_tokens": 8, "temperature": 0, **extra}
        headers = {"X-Session-Id": self.session} if self.session else {}
        return body, headers

    def turn(self, client: httpx.Client, turn: int) -> None:
        body, headers = self.request(turn)
        r = client.post("/v1/chat/completions", json=body, headers=headers)
        assert r.status_code == 200, r.text
        self.acknowledge(turn, r.json()["choices"][0]["message"]["content"], r.headers[HEADER], r.json()["usage"])

    def acknowledge(self, turn: int, text: str, replica: str, usage: dict[str, Any]) -> None:
        self.messages += [_user(turn), {"role": "assistant", "content": text}]
        self.replicas.append(replica)
        self.usage.append(usage)


def _user(turn: int) -> dict[str, str]:
    return {"role": "user", "content": f"question {turn}: tell me more"}


def conversations_on(target: str, ids: set[str], n: int, *, named: bool, tag: str) -> list[Conversation]:
    """`n` new conversations whose routing key ranks `target` first."""
    found: list[Conversation] = []
    i = 0
    while len(found) < n:
        c = Conversation(f"You are assistant {tag}-{i}.", session=f"{tag}-{i}" if named else None)
        if first_choice(c.key, ids) == target:
            found.append(c)
        i += 1
    return found


def test_each_conversation_stays_on_the_replica_that_holds_its_state(served: Cluster) -> None:
    ids = replicas()
    assert len(ids) == 2
    convs = [Conversation(f"You are assistant {i}.") for i in range(5)]
    convs += [Conversation(f"You are named assistant {i}.", session=f"named-{i}") for i in range(2)]
    for turn in range(4):
        for c in convs:
            c.turn(served.client, turn)
    for c in convs:
        assert c.replicas == [first_choice(c.key, ids)] * 4, c.key
        cached = [u["prompt_tokens_details"]["cached_tokens"] for u in c.usage]
        prompts = [u["prompt_tokens"] for u in c.usage]
        for t in range(1, 4):  # the whole previous prompt came from this replica's cache
            assert prompts[t - 1] <= cached[t] < prompts[t], (c.key, cached, prompts)
    for c in convs[5:]:
        assert transcript(served, c) == c.messages


def test_a_killed_replica_loses_no_conversation_and_no_acknowledged_turn(served: Cluster) -> None:
    ids = replicas()
    victim, survivor = sorted(ids)
    doomed = conversations_on(victim, ids, 2, named=False, tag="a") + conversations_on(
        victim, ids, 2, named=True, tag="n"
    )
    safe = conversations_on(survivor, ids, 1, named=False, tag="b") + conversations_on(
        survivor, ids, 1, named=True, tag="m"
    )
    everyone = doomed + safe
    for c in everyone:
        c.turn(served.client, 0)
    assert [c.replicas[0] for c in everyone] == [victim] * 4 + [survivor] * 2

    # Turn 1: a long streamed reply runs on the victim while the others' requests are sent; the victim is
    # killed once the stream has started.
    streaming, others = doomed[0], doomed[1:] + safe
    started = threading.Event()
    outcome: dict[str, Any] = {}

    def stream() -> None:
        body, headers = streaming.request(1, max_tokens=700, ignore_eos=True, stream=True)
        try:
            with served.client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
                outcome["replica"] = r.headers[HEADER]
                for line in r.iter_lines():
                    started.set()
                    outcome["done"] = line == "data: [DONE]" or outcome.get("done", False)
        except httpx.HTTPError as e:
            outcome["error"] = e
        finally:
            started.set()

    def plain(c: Conversation) -> None:
        c.turn(served.client, 1)

    with ThreadPoolExecutor(8) as pool:
        streamed = pool.submit(stream)
        assert started.wait(60)
        answered = [pool.submit(plain, c) for c in others]
        actor = ray.get_actor(PREFIX + victim, namespace="serve")
        ray.kill(actor, no_restart=True)
        streamed.result()
        for f in answered:
            f.result()  # every request got its answer (the ingress retried the victim's on the survivor)
    assert outcome["replica"] == victim
    assert not outcome.get("done"), "the stream finished before the replica was killed"
    streaming.turn(served.client, 1)  # the stream broke: an unacknowledged turn, which the client sends again
    assert all(c.replicas[1] == survivor for c in doomed[1:])

    for c in everyone:  # the next answers, wherever they run now
        c.turn(served.client, 2)
    for c in everyone:
        if c.session:
            assert transcript(served, c) == c.messages, c.session

    # Ray replaces the replica; new conversations that rank it first land on it.
    now = running_replicas_once(lambda ids: len(ids) == 2 and victim not in ids, timeout=120)
    assert survivor in now
    (fresh,) = now - {survivor}
    # The ingress's router hears of the new replica from the same broadcast, a moment later: new
    # conversations that rank it first go elsewhere until then (a real turn each, no sleep between).
    landed: list[str] = []
    deadline = time.monotonic() + 60
    while not landed or landed[-1] != fresh:
        assert time.monotonic() < deadline, f"the router never sent a conversation to {fresh}: {landed}"
        newcomer = conversations_on(fresh, now, 1, named=False, tag=f"c{len(landed)}")[0]
        newcomer.turn(served.client, 0)
        landed.append(newcomer.replicas[0])
    assert set(landed) <= {fresh, survivor}
