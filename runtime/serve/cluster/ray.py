"""Several runtimes on Ray Serve, acting as one OpenAI-compatible service (needs the `cluster` extra).

    app = application(RuntimeConfig.build(model=path, n_threads=1), replicas=2, session_store="redis://host:6379/0")
    url = start(app, host="127.0.0.1", port=8000)          # a local Ray instance unless ray_address is given

Two deployments. `TurnstileReplica` (N replicas, each with its own resources, e.g. one GPU) opens a
`Runtime` and runs the same ASGI app as `turnstile serve` (`runtime.serve.http.app`); every response carries the
replica's id in `X-Turnstile-Replica`. `TurnstileIngress` (one replica, no CPU reserved) is the HTTP entry:
it reads each request, computes its routing key (`runtime.serve.cluster.affinity`) and calls a replica through a
deployment handle with the key as the first argument, where `AffinityRouter` (Ray Serve's request-router
extension point) sees it: Ray's routers never see an HTTP body, so the conversation hash must be computed
before the handle call. With `routing="default"` Ray's own power-of-two-choices router picks instead.

A replica that dies is replaced by Ray's controller; meanwhile the ingress retries a call that failed
before any byte reached the client on another replica (stateless requests recompute their prefix; named
sessions read their transcript from the shared `RedisStore`, and the transcript a retry writes is the same
`messages` + reply, so no acknowledged turn is lost or doubled).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any, Literal, cast

import ray
from ray import serve
from ray.exceptions import ActorUnavailableError, RayActorError
from ray.serve.config import RequestRouterConfig
from ray.serve.exceptions import DeploymentUnavailableError

from runtime.api import Runtime
from runtime.config import RuntimeConfig
from runtime.errors import InvalidConfig
from runtime.log import get_logger
from runtime.serve.cluster.affinity import DEFAULT_LOAD_FACTOR, DEFAULT_SLACK
from runtime.serve.cluster.relay import REPLICA_HEADER, Batch, Forwarder, drive
from runtime.serve.http.app import DEFAULT_MAX_BODY_BYTES
from runtime.serve.http.app import app as make_app

__all__ = [
    "INGRESS",
    "REPLICA",
    "REPLICA_HEADER",
    "ROUTER",
    "TurnstileIngress",
    "TurnstileReplica",
    "application",
    "replica_actor_name",
    "start",
    "stop",
]

log = get_logger(__name__)

INGRESS = "TurnstileIngress"
REPLICA = "TurnstileReplica"
ROUTER = "runtime.serve.cluster.router:AffinityRouter"
Routing = Literal["affinity", "default"]
_RETRYABLE = (RayActorError, ActorUnavailableError, DeploymentUnavailableError)
# the directory that holds `runtime/`: one level up per dotted part of this module's name
_ROOT = str(Path(__file__).resolve().parents[len(__name__.split(".")) - 1])


@serve.deployment(name=REPLICA)
class TurnstileReplica:
    """One Runtime (one slot, its RAM cache and disk tier) behind the HTTP app, called by the ingress."""

    async def __init__(  # type: ignore[misc]
        self, config: RuntimeConfig, session_store: str | None, app_options: dict[str, Any]
    ) -> None:
        self.replica = serve.get_replica_context().replica_id.unique_id
        self._stop = asyncio.Event()
        opened: asyncio.Future[Runtime] = asyncio.get_running_loop().create_future()
        self._holder = asyncio.ensure_future(self._hold(config, session_store, opened))
        self.runtime = await opened
        self.app = make_app(self.runtime, **app_options)
        log.info("replica.ready", replica=self.replica, model=self.runtime.model_name)

    async def _hold(self, config: RuntimeConfig, session_store: str | None, opened: asyncio.Future[Runtime]) -> None:
        """Keep the Runtime open (in one task: its task group lives here) until the replica stops."""
        try:
            async with Runtime.open(config=config, session_store=session_store) as rt:
                opened.set_result(rt)
                await self._stop.wait()
        except BaseException as e:
            if not opened.done():
                opened.set_exception(e)
            raise

    async def handle(self, key: str, scope: dict[str, Any], body: bytes) -> AsyncIterator[Batch]:
        """One HTTP request (`key` is for the router): the app's ASGI messages, in batches."""
        async for batch in drive(self.app, scope, body, self.replica):
            yield batch

    async def check_health(self) -> None:
        if self._holder.done():
            raise RuntimeError(f"replica {self.replica}: the runtime has stopped")

    async def __del__(self) -> None:
        """Ray stops the replica: finish the running turn, flush the disk tier, free the model."""
        self._stop.set()
        await asyncio.wait({self._holder}, timeout=60)


@serve.deployment(name=INGRESS)
@serve.ingress()
class TurnstileIngress:
    """The HTTP entry: routes each request to a replica by its conversation (see `runtime.serve.cluster.relay`)."""

    def __init__(self, replicas: Any, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.replicas = replicas.options(stream=True)
        self.max_body_bytes = max_body_bytes

    async def _call(self, key: str, scope: dict[str, Any], body: bytes) -> AsyncIterator[Batch]:
        responses = self.replicas.handle.remote(key, scope, body)
        finished = False
        try:
            async for batch in responses:
                yield batch
            finished = True
        finally:
            if not finished:
                responses.cancel()

    def __serve_build_asgi_app__(self) -> Forwarder:
        return Forwarder(self._call, max_body_bytes=self.max_body_bytes, retryable=_RETRYABLE)


def application(
    config: RuntimeConfig | Mapping[str, Any],
    *,
    replicas: int = 2,
    routing: Routing = "affinity",
    session_store: str | None = None,
    num_cpus_per_replica: float = 1.0,
    num_gpus_per_replica: float = 0.0,
    max_ongoing_requests: int = 64,
    api_key: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    request_timeout: float | None = None,
    model_name: str | None = None,
    load_factor: float = DEFAULT_LOAD_FACTOR,
    slack: int = DEFAULT_SLACK,
) -> serve.Application:
    """The Ray Serve application: `replicas` runtimes opened with `Runtime.open(config=config)` (a mapping: the
    settings of `RuntimeConfig.build`, checked here, before anything is deployed).

    `session_store`: a Redis URL every replica keeps its sessions in (else each keeps its own, as
    `Runtime.open` would). `max_ongoing_requests`: requests a replica holds (running or queued in its
    Runtime) before the router looks elsewhere. `load_factor`, `slack`: the affinity router's load bound.
    """
    _check(replicas, routing, num_cpus_per_replica, num_gpus_per_replica, max_ongoing_requests, load_factor, slack)
    settings = config if isinstance(config, RuntimeConfig) else RuntimeConfig.build(**config)
    app_options = {
        "api_key": api_key,
        "max_body_bytes": max_body_bytes,
        "request_timeout": request_timeout,
        "model_name": model_name,
    }
    replica_options: dict[str, Any] = {
        "num_replicas": replicas,
        "max_ongoing_requests": max_ongoing_requests,
        "ray_actor_options": {"num_cpus": num_cpus_per_replica, "num_gpus": num_gpus_per_replica},
    }
    if routing == "affinity":
        router: dict[str, Any] = {
            "request_router_class": ROUTER,
            "request_router_kwargs": {"load_factor": load_factor, "slack": slack},
        }
        replica_options["request_router_config"] = RequestRouterConfig(**router)
    replica = cast(Any, TurnstileReplica).options(**replica_options).bind(settings, session_store, app_options)
    ingress: serve.Application = (
        cast(Any, TurnstileIngress)
        .options(num_replicas=1, max_ongoing_requests=100_000, ray_actor_options={"num_cpus": 0})
        .bind(replica, max_body_bytes)
    )
    return ingress


def _check(replicas: int, routing: str, cpus: float, gpus: float, ongoing: int, load_factor: float, slack: int) -> None:
    for name, value, low in (("replicas", replicas, 1), ("max_ongoing_requests", ongoing, 1), ("slack", slack, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise InvalidConfig(f"{name} must be an int >= {low}, not {value!r}")
    if routing not in ("affinity", "default"):
        raise InvalidConfig(f"routing must be 'affinity' or 'default', not {routing!r}")
    for name, x in (("num_cpus_per_replica", cpus), ("num_gpus_per_replica", gpus)):
        if isinstance(x, bool) or not isinstance(x, int | float) or x < 0:
            raise InvalidConfig(f"{name} must be a number >= 0, not {x!r}")
    if isinstance(load_factor, bool) or not isinstance(load_factor, int | float) or load_factor < 1:
        raise InvalidConfig(f"load_factor must be a number >= 1, not {load_factor!r}")


def start(
    app: serve.Application,
    *,
    ray_address: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    name: str = "turnstile",
    num_cpus: int | None = None,
) -> str:
    """Connect to Ray (`ray_address`; None starts a local instance), run `app` at `/`; its URL when ready."""
    if not ray.is_initialized():
        if ray_address is None:  # workers start from this process: they find `runtime` where it is found
            path = os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p)
            env = {"env_vars": {"PYTHONPATH": path}}
            ray.init(num_cpus=num_cpus, include_dashboard=False, runtime_env=env)
        else:
            ray.init(address=ray_address)
    serve.start(http_options={"host": host, "port": port})
    serve.run(app, name=name, route_prefix="/")
    shown = f"[{host}]" if ":" in host else host
    log.info("cluster.ready", name=name, host=host, port=port)
    return f"http://{shown}:{port}"


def stop(name: str = "turnstile", *, shutdown: bool = True) -> None:
    """Delete the application (replicas drain and flush); `shutdown`: stop Serve and leave Ray."""
    serve.delete(name)
    if shutdown:
        serve.shutdown()  # type: ignore[no-untyped-call]
        ray.shutdown()


def replica_actor_name(replica: str, *, app: str = "turnstile") -> str:
    """The Ray actor name of a replica (the id in `X-Turnstile-Replica`); `ray.get_actor(n, namespace="serve")`."""
    return f"SERVE_REPLICA::{app}#{REPLICA}#{replica}"
