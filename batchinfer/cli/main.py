"""The `batchinfer` process: run the command, then end without the interpreter's teardown. With torch loaded,
freeing every module and running libtorch's static destructors costs CPU at each exit (docs/benchmarks.md,
"Start-up, fourth pass"); what a normal exit does that anyone sees still happens first."""
from __future__ import annotations

import atexit
import os
import sys
import threading


def main() -> None:
    """The console script and `python -m batchinfer.cli`. Click ends every command with SystemExit; any other
    exception (a bug's traceback, Ctrl-C outside a command) takes the interpreter's own way out. A `run` forks
    its engine process first, before the CLI's imports (batchinfer/runtime/engine_process.py)."""
    from batchinfer.runtime.engine_process import start_for  # lazy: the engine process forks before any other import

    start_for(sys.argv[1:])
    from batchinfer.cli.app import app  # lazy: the CLI's imports run beside the forked engine process

    try:
        app(prog_name="batchinfer")
    except SystemExit as exc:
        exit_now(exc.code)


def exit_now(code: object) -> None:
    """sys.exit(code), less the teardown: non-daemon threads are waited for (a normal exit is taken while any
    runs, or under a profiler or tracer: `python -m cProfile` writes its file after the command returns), atexit
    handlers run (logging's flush among them), database connections close, stdout and stderr are flushed (a
    failed flush takes the normal exit, which reports it as it always has)."""
    if not (code is None or isinstance(code, int)) or _threads_to_wait_for() or sys.getprofile() or sys.gettrace():
        raise SystemExit(code)
    atexit._run_exitfuncs()
    _close_databases()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        raise SystemExit(code) from None
    os._exit(code or 0)


def _threads_to_wait_for() -> bool:
    main_thread = threading.main_thread()
    return any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not main_thread)


def _close_databases() -> None:
    session = sys.modules.get("batchinfer.db.session")  # never imported by this command: nothing to close
    if session is not None:
        session.dispose_all()
