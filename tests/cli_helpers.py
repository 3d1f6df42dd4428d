"""Run the real `batchinfer` command in a subprocess, as a user would."""
from __future__ import annotations

import os
import subprocess
import sys


def cli_env(tmp_path, model_cache: str, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHINFER_")}
    env.update({"BATCHINFER_DATA_DIR": str(tmp_path / "data"), "BATCHINFER_MODEL_CACHE": model_cache,
                "PYTHONUNBUFFERED": "1", "COLUMNS": "200"})
    env.update(extra)
    return env


def batchinfer(env: dict, *args: str, timeout: float = 300, input_text: str | None = None):
    return subprocess.run([sys.executable, "-m", "batchinfer.cli", *args], env=env, capture_output=True,
                          text=True, timeout=timeout, input=input_text)
