"""Processes the tests start (servers, workers): a free loopback port, start the CLI, stop a process group.
The helpers live in the package (batchinfer.bench.services) because `batchinfer bench-load` starts the same ones."""
from __future__ import annotations

from batchinfer.bench.services import free_port, start_cli, stop

__all__ = ["free_port", "start_cli", "stop"]
