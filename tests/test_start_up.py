"""Start-up imports only what the command needs: each heavy package costs tenths of a second to
seconds at every start. Timings are the bench's (`batchinfer bench process -w single`); this pins the imports."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid

from cli_helpers import batchinfer, cli_env, wait_for
from jobfiles import chat_line
from batchinfer.cli.openmp import SPIN, other_runnable, wait_policy

NEVER_ON_RUN = {"alembic", "boto3", "celery", "fastapi", "gguf", "redis", "transformers", "uvicorn"}
# Runs the CLI as `python -m batchinfer.cli` does and prints the top-level packages it imported; from an atexit
# handler, since the CLI ends with os._exit once they have run (batchinfer/cli/main.py).
PROBE = ("import atexit, json, runpy, sys\n"
         "sys.argv = ['batchinfer', *sys.argv[1:]]\n"
         "atexit.register(lambda: print(json.dumps(sorted({m.split('.')[0] for m in sys.modules}))))\n"
         "runpy.run_module('batchinfer.cli', run_name='__main__')\n")


def _imported(env: dict, *args: str) -> tuple[int, set[str]]:
    out = subprocess.run([sys.executable, "-c", PROBE, *args], env=env, capture_output=True, text=True, timeout=300)
    return out.returncode, set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_the_cli_imports_neither_torch_nor_services_before_a_command_needs_them(tmp_path, model_cache):
    env = cli_env(tmp_path, model_cache)
    assert _imported(env, "list")[0] == 0  # a new database: this one migrates (Alembic)
    rc, modules = _imported(env, "list")
    assert rc == 0
    assert modules & (NEVER_ON_RUN | {"torch", "numpy", "jinja2", "tokenizers"}) == set()


def test_run_of_one_request_imports_torch_but_no_service_client_alembic_or_transformers(tmp_path, model_cache):
    env = cli_env(tmp_path, model_cache, BATCHINFER_ENGINE_PROCESS="0")
    requests = tmp_path / "one.jsonl"
    requests.write_text(chat_line("a", "Hi", max_tokens=1) + "\n")
    assert _imported(env, "run", str(requests), "-o", str(tmp_path / "first.jsonl"))[0] == 0  # makes the db
    rc, modules = _imported(env, "run", str(requests), "-o", str(tmp_path / "out.jsonl"))
    assert rc == 0 and (tmp_path / "out.jsonl").read_text().count("\n") == 1
    assert "torch" in modules and modules & NEVER_ON_RUN == set()
    # in two processes (the default) torch is the engine process's alone (batchinfer/runtime/engine_process.py)
    rc, modules = _imported(env | {"BATCHINFER_ENGINE_PROCESS": "1"}, "run", str(requests), "-o", str(tmp_path / "two.jsonl"))
    assert rc == 0 and (tmp_path / "two.jsonl").read_text().count("\n") == 1
    assert modules & (NEVER_ON_RUN | {"torch"}) == set()
    # the exit skips the teardown but closes the database: SQLite folds its write-ahead log back in and removes it
    assert (tmp_path / "data" / "batchinfer.db").exists() and not (tmp_path / "data" / "batchinfer.db-wal").exists()


def test_the_cli_ends_without_the_interpreters_teardown_once_atexit_handlers_ran(tmp_path, model_cache):
    # freeing torch's modules and libtorch's destructors cost ~0.5 s of CPU per exit (docs/benchmarks.md)
    probe = ("import atexit, runpy, sys\n"
             "class Witness:\n    def __del__(self):\n        sys.stderr.write('torn down\\n')\n"
             "witness = Witness()\n"
             "atexit.register(lambda: sys.stderr.write('atexit ran\\n'))\n"
             "sys.argv = ['batchinfer', *sys.argv[1:]]\n"
             "runpy.run_module('batchinfer.cli', run_name='__main__')\n")
    env = cli_env(tmp_path, model_cache)
    for args, code in ((["list", "--json"], 0), (["run", str(tmp_path / "missing.jsonl"), "-o", "x"], 1), (["nosuch"], 2)):
        out = subprocess.run([sys.executable, "-c", probe, *args], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == code, out.stderr
        assert "atexit ran" in out.stderr and "torn down" not in out.stderr
    assert json.loads(subprocess.run([sys.executable, "-c", probe, "list", "--json"], env=env, capture_output=True,
                                     text=True, timeout=300).stdout) == []  # stdout (a pipe) was flushed
    # under a profiler the normal exit is taken: cProfile writes its file after the command returns
    profiled = subprocess.run([sys.executable, "-m", "cProfile", "-o", str(tmp_path / "list.prof"), "-m", "batchinfer.cli",
                               "list"], env=env, capture_output=True, text=True, timeout=300)
    assert profiled.returncode == 0 and (tmp_path / "list.prof").stat().st_size > 0, profiled.stderr


def test_openmp_threads_spin_briefly_on_a_quiet_machine_and_sleep_on_a_busy_one():
    assert wait_policy({}, others=0, cores=2) == {"GOMP_SPINCOUNT": SPIN}
    assert wait_policy({}, others=1, cores=2) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert wait_policy({}, others=4, cores=16) == {"GOMP_SPINCOUNT": SPIN}
    assert wait_policy({}, others=5, cores=16) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert wait_policy({"OMP_WAIT_POLICY": "ACTIVE"}, others=0, cores=2) == {}  # the user's choice stands
    assert wait_policy({"GOMP_SPINCOUNT": "0"}, others=9, cores=2) == {}
    assert 0 <= other_runnable() < 10_000


def test_the_cli_sets_the_wait_policy_before_torch_loads_unless_the_user_chose_one():
    # libgomp reads it once, when torch loads it (docs/benchmarks.md, "OpenMP wait policy")
    show = "import os, batchinfer.cli; print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'))"
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out = subprocess.run([sys.executable, "-c", show], env=clean, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() in (["None", SPIN], ["PASSIVE", "None"]), out.stderr
    out = subprocess.run([sys.executable, "-c", show], env=clean | {"OMP_WAIT_POLICY": "ACTIVE"}, capture_output=True,
                         text=True, timeout=120)
    assert out.stdout.split() == ["ACTIVE", "None"], out.stderr


def test_the_worker_starts_celery_without_celerys_command_group(tmp_path, model_cache, postgres_url, redis_server):
    # the group (app.worker_main) imports every subcommand, the amqp shell's prompt_toolkit among them, at each start
    env = cli_env(tmp_path, model_cache, BATCHINFER_DATABASE_URL=postgres_url, BATCHINFER_BROKER_URL=f"{redis_server}/0",
                  BATCHINFER_BROKER_PREFIX=f"bitest-{uuid.uuid4().hex[:8]}:", BATCHINFER_ENGINE="null",
                  PYTHONPROFILEIMPORTTIME="1")
    assert batchinfer(env, "db", "upgrade").returncode == 0
    log = tmp_path / "worker.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "batchinfer.cli", "worker", "--name", "startup-imports"], env=env,
                                stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: " ready." in log.read_text(errors="replace") or proc.poll() is not None, "the worker's ready line",
                 timeout=180)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
    text = log.read_text(errors="replace")
    assert "startup-imports@" in text and " ready." in text, text[-3000:]  # Celery's banner and ready line, as before
    imported = {line.rsplit("|", 1)[1].strip() for line in text.splitlines() if line.startswith("import time:")}
    assert "celery.bin.worker" in imported
    assert imported & {"celery.bin.celery", "celery.bin.amqp", "click_repl", "prompt_toolkit"} == set()
