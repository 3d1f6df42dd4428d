"""Start-up imports only what the command needs: each heavy package costs tenths of a second to
seconds at every start. Timings are the bench's (`batchinfer bench process -w single`); this pins the imports."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from cli_helpers import cli_env
from jobfiles import chat_line

NEVER_ON_RUN = {"alembic", "boto3", "celery", "fastapi", "gguf", "redis", "transformers", "uvicorn"}
# Runs the CLI in this process and prints the top-level packages it imported.
PROBE = ("import runpy, sys, json\n"
         "sys.argv = ['batchinfer', *sys.argv[1:]]\n"
         "try:\n    runpy.run_module('batchinfer.cli', run_name='__main__')\n"
         "except SystemExit as exc:\n    code = exc.code\n"
         "print(json.dumps({'rc': code, 'modules': sorted({m.split('.')[0] for m in sys.modules})}))\n")


def _imported(env: dict, *args: str) -> tuple[int, set[str]]:
    out = subprocess.run([sys.executable, "-c", PROBE, *args], env=env, capture_output=True, text=True, timeout=300)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    return report["rc"], set(report["modules"])


def test_the_cli_imports_neither_torch_nor_services_before_a_command_needs_them(tmp_path, model_cache):
    env = cli_env(tmp_path, model_cache)
    assert _imported(env, "list")[0] in (0, None)  # a new database: this one migrates (Alembic)
    rc, modules = _imported(env, "list")
    assert rc in (0, None)
    assert modules & (NEVER_ON_RUN | {"torch", "numpy", "jinja2", "tokenizers"}) == set()


def test_run_of_one_request_imports_torch_but_no_service_client_alembic_or_transformers(tmp_path, model_cache):
    env = cli_env(tmp_path, model_cache)
    requests = tmp_path / "one.jsonl"
    requests.write_text(chat_line("a", "Hi", max_tokens=1) + "\n")
    assert _imported(env, "run", str(requests), "-o", str(tmp_path / "first.jsonl"))[0] in (0, None)  # makes the db
    rc, modules = _imported(env, "run", str(requests), "-o", str(tmp_path / "out.jsonl"))
    assert rc in (0, None) and (tmp_path / "out.jsonl").read_text().count("\n") == 1
    assert "torch" in modules and modules & NEVER_ON_RUN == set()


def test_the_cli_lets_openmp_threads_sleep_unless_the_user_chose_a_wait_policy():
    # set before torch loads libgomp, which reads it once (docs/benchmarks.md, "OpenMP wait policy")
    show = "import os, batchinfer.cli; print(os.environ['OMP_WAIT_POLICY'])"
    for given, expected in ((None, "PASSIVE"), ("ACTIVE", "ACTIVE")):
        env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"} | ({"OMP_WAIT_POLICY": given} if given else {})
        out = subprocess.run([sys.executable, "-c", show], env=env, capture_output=True, text=True, timeout=120)
        assert out.stdout.strip() == expected, out.stderr
