"""`turnstile serve --replicas N`: N runtimes on Ray Serve behind one endpoint (needs the `cluster` extra).

Without `--ray-address` a local Ray instance is started (and stopped on exit); with it, the application is
deployed on that cluster (every node must have turnstile installed and the model at the same path). Once
the application is ready it prints `turnstile serve: listening on URL (model NAME, N replicas)`; SIGTERM or
Ctrl-C deletes the application (each replica finishes its running turn and flushes its disk tier).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from runtime.config import RuntimeConfig

__all__ = ["add_arguments", "check_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("several replicas on Ray Serve")
    g.add_argument("--replicas", type=int, default=None, metavar="N", help="run N runtimes on Ray Serve")
    g.add_argument("--ray-address", default=None, metavar="ADDR", help="a running Ray cluster (default: start one)")
    g.add_argument("--num-cpus-per-replica", type=float, default=1.0, metavar="X", help="CPUs Ray reserves (1)")
    g.add_argument("--num-gpus-per-replica", type=float, default=0.0, metavar="Y", help="GPUs Ray reserves (0)")
    g.add_argument(
        "--routing", choices=("affinity", "default"), default="affinity", help="conversation affinity or Ray's own"
    )


def check_arguments(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.replicas is None:
        if args.ray_address is not None:
            p.error("--ray-address needs --replicas")
        return
    if args.replicas < 1:
        p.error("--replicas must be at least 1")
    if args.num_cpus_per_replica < 0 or args.num_gpus_per_replica < 0:
        p.error("--num-cpus-per-replica and --num-gpus-per-replica must be >= 0")
    if args.scripted:
        p.error("--scripted does not run on Ray")


async def run(args: argparse.Namespace, options: dict[str, Any], config: RuntimeConfig) -> int:
    """Deploy, print the ready line, wait for SIGTERM / SIGINT, then delete the application."""
    from runtime.serve.cluster import ray as cluster

    app = cluster.application(
        config,
        replicas=args.replicas,
        routing=args.routing,
        session_store=args.session_store,
        num_cpus_per_replica=args.num_cpus_per_replica,
        num_gpus_per_replica=args.num_gpus_per_replica,
        api_key=args.api_key or os.environ.get("TURNSTILE_API_KEY") or None,
        max_body_bytes=args.max_body,
        request_timeout=args.timeout,
        model_name=args.model_name,
    )
    port = args.port if args.port else _free_port(args.host)
    start = partial(cluster.start, app, ray_address=args.ray_address, host=args.host, port=port)
    url = await anyio.to_thread.run_sync(start)
    # after ray.init, which installs its own SIGTERM handler (it would end the process without a drain)
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        name = args.model_name or Path(options["model"]).name
        sys.stdout.write(f"turnstile serve: listening on {url} (model {name}, {args.replicas} replicas)\n")
        sys.stdout.flush()
        async for _ in signals:
            break
    await anyio.to_thread.run_sync(partial(cluster.stop, shutdown=args.ray_address is None))
    return 0


def _free_port(host: str) -> int:
    """Ray's HTTP proxy needs a port number: `--port 0` picks one that is free now."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
