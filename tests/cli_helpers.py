"""Run the real `batchinfer` command in a subprocess, as a user would."""
from __future__ import annotations

import os
import subprocess
import sys
import time


def cli_env(tmp_path, model_cache: str, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHINFER_")}
    env.update({"BATCHINFER_DATA_DIR": str(tmp_path / "data"), "BATCHINFER_MODEL_CACHE": model_cache,
                "PYTHONUNBUFFERED": "1", "COLUMNS": "200"})
    env.update(extra)
    return env


def batchinfer(env: dict, *args: str, timeout: float = 300, input_text: str | None = None):
    return subprocess.run([sys.executable, "-m", "batchinfer.cli", *args], env=env, capture_output=True,
                          text=True, timeout=timeout, input=input_text)


def batchinfer_into_closed_pipe(env: dict, *args: str, timeout: float = 300):
    """`batchinfer ARGS | head` where head has already gone: stdout is a pipe whose reader is closed,
    so the first write fails (deterministically, unlike racing a real head)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([sys.executable, "-m", "batchinfer.cli", *args], env=env, stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=timeout)
    finally:
        os.close(write_end)


def wait_for(condition, what: str, timeout: float = 240.0, every: float = 0.2):
    """condition()'s first truthy value; fails naming `what` once `timeout` seconds pass without one."""
    deadline = time.time() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(every)


def wait_healthy(server: subprocess.Popen, url: str, log_path, timeout: float = 120.0) -> None:
    """Until `batchinfer serve` at url answers /health with 200; fails with its log if it exits first."""
    import httpx

    deadline = time.time() + timeout
    while True:
        assert server.poll() is None, log_path.read_text()[-3000:]
        assert time.time() < deadline, "the server did not come up"
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.3)
