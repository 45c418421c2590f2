"""`AffinityRouter`: a Ray Serve request router (`ray.serve.request_router.RequestRouter`, Ray >= 2.46) that
sends each conversation to the replica holding its state, with bounded load (`runtime.serve.cluster.affinity`).

Ray calls `choose_replicas` in the process that holds the deployment handle (here the ingress replica), with
the pending request's handle arguments; the ingress passes the routing key as the first argument, since a
router never sees an HTTP request's body. The ranks returned are tried in order: Ray takes the first rank
with a replica whose queue is below `max_ongoing_requests` (probing queue lengths it does not know), and
backs off and asks again when none has room. Queue lengths come from Ray's per-handle cache (incremented
when a request is sent, decremented when it ends), so bounded load needs no extra calls.
"""

from __future__ import annotations

from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from runtime.log import get_logger
from runtime.serve.cluster.affinity import DEFAULT_LOAD_FACTOR, DEFAULT_SLACK, Placements, order

__all__ = ["AffinityRouter", "key_of"]

log = get_logger(__name__)


def key_of(request: PendingRequest | None) -> str | None:
    """The routing key the ingress put first in the handle call's arguments (None if there is none)."""
    if request is None:
        return None
    if request.args and isinstance(request.args[0], str):
        return request.args[0]
    key = request.kwargs.get("route_key")
    return key if isinstance(key, str) else None


class AffinityRouter(RequestRouter):
    """Rendezvous hashing on the routing key, the key's last replica first, bounded load."""

    def initialize_state(
        self, load_factor: float = DEFAULT_LOAD_FACTOR, slack: int = DEFAULT_SLACK, remember: int = 100_000, **_: Any
    ) -> None:
        """Called by Ray with `RequestRouterConfig.request_router_kwargs`."""
        self.load_factor = float(load_factor)
        self.slack = int(slack)
        self.placements = Placements(remember)

    def _state(self) -> Placements:
        if not hasattr(self, "placements"):  # Ray calls initialize_state; a bare instance still works
            self.initialize_state()
        return self.placements

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        placements = self._state()
        key = key_of(pending_request)
        if key is None or not candidate_replicas:
            return [list(candidate_replicas)]  # no key: the least loaded of all
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        cache = self.replica_queue_len_cache
        loads = {rid: cache.get(r.replica_id) or 0 for rid, r in by_id.items()}
        ranked = order(key, loads, last=placements.get(key), load_factor=self.load_factor, slack=self.slack)
        return [[by_id[rid]] for rid in ranked]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        key = key_of(pending_request)
        if key is not None:
            self._state().put(key, replica_id.unique_id)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._state().forget_replica(replica_id.unique_id)
        log.info("router.replica_died", replica=replica_id.unique_id)
