"""Start `batchinfer worker` processes and wait until they are live: the one harness of the load and grouping
benchmarks and of the fault matrix (tests/faults)."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

from .services import start_cli


def start_worker(env: dict, log_path: Path, name: str, *args: str) -> subprocess.Popen:
    """`batchinfer worker --name NAME ARGS` with `env`, in its own process group, output to log_path."""
    return start_cli(env, log_path, "worker", "--name", name, *args)


def live_incarnations(settings) -> dict[str, str]:
    """Each live worker's name and incarnation, as the registry of these settings lists them."""
    from batchinfer.cluster.registry import open_registry

    return {w.name: w.incarnation for w in open_registry(settings).live()}


def wait_live(settings, procs: dict[str, subprocess.Popen], timeout: float, not_incarnations: dict | None = None,
              log_tail=lambda name: "") -> None:
    """Until every worker of `procs` beats (it is listed once its model is loaded), as a new process: a killed
    one's key may outlive it for the TTL, so an incarnation in `not_incarnations` does not count. Raises at once
    if one exits; a registry that is down for a moment (a fault case) is asked again until the deadline."""
    old = not_incarnations or {}
    deadline = time.time() + timeout
    while True:
        for name, proc in procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"worker {name} exited:\n{log_tail(name)}")
        try:
            live = live_incarnations(settings)
        except Exception:  # the registry's Redis may be restarting (the fault matrix does that); ask again
            live = {}
        if all(name in live and live[name] != old.get(name) for name in procs):
            return
        if time.time() > deadline:
            raise TimeoutError(f"workers {sorted(procs)} not live after {timeout:.0f} s:\n{log_tail(next(iter(procs)))}")
        time.sleep(0.3)
