"""Processes the tests start (servers, workers): a free loopback port, start the CLI, stop a process group."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_cli(env: dict, log_path, *args: str) -> subprocess.Popen:
    """`batchinfer ARGS` in its own process group, output to log_path."""
    return subprocess.Popen([sys.executable, "-m", "batchinfer.cli", *args], env=env, stdout=open(log_path, "wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    """SIGTERM the process group, SIGKILL it after grace_s."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
