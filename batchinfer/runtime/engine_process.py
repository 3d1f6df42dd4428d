"""`batchinfer run` and `batchinfer worker` in two processes. Importing torch is most of a warm start
(docs/benchmarks.md, "Start-up"), and a thread cannot overlap it (one GIL). So a child forked before the CLI's own
imports imports torch and loads the model while the parent parses, validates and submits (run) or starts Celery
and connects to its services (worker); the parent's unit runner then generates through it (RemoteGenerator).
BATCHINFER_ENGINE_PROCESS=0 keeps all in one process; so does a worker on the null engine, which loads no torch."""
from __future__ import annotations

import atexit
import contextlib
import dataclasses
import io
import os
import signal
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: every command imports this module at its start (batchinfer/cli/main.py)
    from multiprocessing.connection import Connection

_started: EngineProcess | None = None
_command: str | None = None  # the forking command, until started() has checked its settings
ENGINE_VAR, ENGINE_PROCESS_VAR = "BATCHINFER_ENGINE", "BATCHINFER_ENGINE_PROCESS"
FALSE = ("0", "off", "f", "false", "n", "no")  # pydantic's false strings, in any case
IMPORT_NICE = 5  # how far the torch import yields to the parent's work on a busy machine (3:1 at equal shares)


def start_for(argv: list[str]) -> None:
    """Fork the engine process if this command is a `run` or a `worker`. Called first thing: no thread, no torch, no
    pydantic yet (the child imports none: its torch import starts 0.13 s sooner). The environment decides here;
    started() checks the settings themselves."""
    global _started, _command
    if argv[:1] not in (["run"], ["worker"]) or "--help" in argv:
        return
    # what both processes need, imported once before the fork (the engine's plain types: no pydantic, no torch)
    import batchinfer.runtime.engine_host  # noqa: F401
    import batchinfer.runtime.engine_messages  # noqa: F401

    _command = argv[0]
    if _process_asked() and (_command == "run" or _needs_torch()):
        _started = EngineProcess.fork(signals_to_parent=_command == "worker", decodes=_command == "run")
        atexit.register(_started.close)  # an invalid file's error, or the end: the child is killed, not awaited


def _process_asked() -> bool:
    """BATCHINFER_ENGINE_PROCESS as the settings read it (a value they refuse forks here; started() ends it)."""
    return os.environ.get(ENGINE_PROCESS_VAR, "").strip().lower() not in FALSE


def _forks(command: str) -> bool:
    from pydantic import ValidationError  # lazy: this module loads first, before the fork: nothing heavy at its top

    from batchinfer.settings import get_settings

    try:
        settings = get_settings()
    except ValidationError:  # the command reports it, in one line
        return False
    # a null-engine worker has no torch to overlap, and its many results would only cross a pipe
    return settings.engine_process and (command == "run" or settings.engine != "null")


def started() -> EngineProcess | None:
    """The engine process, where the settings want one: a fork the environment asked for and the settings refuse
    (an invalid value) is ended here."""
    global _started, _command
    if _command is not None:
        if _started is not None and not _forks(_command):
            _started.close()
            _started = None
        _command = None
    return _started


def generator_for(settings):
    """The generator for settings: through the engine process when this process forked one, else loaded here."""
    if _started is not None:
        return _started.generator_for(settings)
    from batchinfer.runtime.engine_host import get_generator  # lazy: the engine host loads the model

    return get_generator(settings)


class EngineProcessLost(BaseException):
    """The engine process died (killed: out of memory, a signal). A BaseException: no request of the unit failed,
    so the unit runner must not record one; the run stops and says so."""


class EngineProcess:
    """The parent's handle: load(settings) as soon as the options are known, generator_for(settings) when a unit
    needs it, close() on the way out (the process holds nothing to save: it is killed)."""

    def __init__(self, pid: int, conn: Connection, decodes: bool = False):
        self.pid, self.conn = pid, conn
        self.decodes = decodes  # this process decodes the results' texts (the child never reads tokenizer.json)
        self.settings = None
        self._generator = None
        self._status: int | None = None

    @classmethod
    def fork(cls, signals_to_parent: bool = False, decodes: bool = False) -> EngineProcess:
        """signals_to_parent: the child ignores SIGINT and SIGTERM sent to the process group (a worker's warm
        shutdown finishes or interrupts its unit, then kills the child); a run's child ends with the run on Ctrl-C.
        decodes: the results come back undecoded and this process decodes them (`run`: its validation loaded the
        same tokenizer; a worker's parent holds none, and its child keeps decoding)."""
        from multiprocessing.connection import Pipe  # lazy: this module loads first, before the fork

        parent_end, child_end = Pipe()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            parent_end.close()
            if signals_to_parent:
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            _serve(child_end, parent)  # never returns
        child_end.close()
        return cls(pid, parent_end, decodes)

    def load(self, settings) -> None:
        from batchinfer.runtime import engine_messages as msg  # lazy: this module loads first, before the fork
        from batchinfer.runtime.engine_host import EngineSettings

        self.settings = settings
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # it died: generator_for says how
            # decoded here, the child never reads tokenizer.json (0.09 s of its start) unless a request needs it there
            self.conn.send(msg.Load(dataclasses.replace(EngineSettings.of(settings), detokenize=not self.decodes)))

    def generator_for(self, settings):
        """The remote generator when settings name the model loaded there, else the model loaded in this process
        (another model of BATCHINFER_MODELS). Raises what the load raised, as get_generator would."""
        from batchinfer.runtime import engine_messages as msg  # lazy: this module loads first, before the fork
        from batchinfer.runtime.engine_host import generator_key, get_generator
        from batchinfer.runtime.remote_generator import RemoteGenerator

        if self.settings is None or generator_key(settings) != generator_key(self.settings):
            return get_generator(settings)
        if self._generator is None:
            reply = self.recv()
            if isinstance(reply, msg.Failed):
                raise reply.exception()
            self._generator = RemoteGenerator(self, reply)
        return self._generator

    def send(self, message) -> None:
        try:
            self.conn.send(message)
        except (BrokenPipeError, ConnectionResetError):
            raise self._lost() from None

    def recv(self, timeout_s: float | None = None):
        """The next message, or None after timeout_s."""
        try:
            if timeout_s is not None and not self.conn.poll(timeout_s):
                return None
            return self.conn.recv()
        except (EOFError, ConnectionResetError):
            raise self._lost() from None

    def close(self) -> None:
        if self._status is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            self._reap()
        self.conn.close()

    def _reap(self) -> int:
        if self._status is None:
            self._status = os.waitpid(self.pid, 0)[1]
        return self._status

    def _lost(self) -> EngineProcessLost:
        status = self._reap()
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            why = " (out of memory?)" if sig == signal.SIGKILL else ""
            return EngineProcessLost(f"the engine process was killed by {signal.Signals(sig).name}{why}")
        return EngineProcessLost(f"the engine process ended (exit code {os.WEXITSTATUS(status)})")


def _serve(conn: Connection, parent: int) -> None:
    """The child's whole life; it ends with os._exit (the parent's atexit handlers and buffers are not its own)."""
    code = 0
    try:
        _die_with_parent(parent)
        generator = _import_and_load(conn)
        if generator is not None:
            _answer(conn, generator)
    except (EOFError, BrokenPipeError, ConnectionResetError):  # the parent is gone or done
        pass
    except KeyboardInterrupt:  # Ctrl-C reached the whole group: the parent reports it
        code = 130
    except BaseException:  # noqa: BLE001 - nothing of the child may print a traceback over the parent's output
        code = 1
    os._exit(code)


def _import_and_load(conn: Connection):
    """torch and the model with the cyclic GC off: the import and the load made some 340 collections (0.12-0.16 s
    of the critical path on a Zen 5), over objects that all live as long as the process. They are frozen after
    (the permanent generation): the engine's own collections never walk them again."""
    import gc  # lazy: the child's only

    gc.disable()
    try:
        if _needs_torch():
            _import_torch_yielding()
        return _load(conn, conn.recv())
    finally:
        gc.freeze()
        gc.enable()


def _needs_torch() -> bool:
    return os.environ.get(ENGINE_VAR, "").strip() != "null"  # the null engine needs none (most tests run it)


def _die_with_parent(parent: int) -> None:
    """The parent killed outright (SIGKILL) cannot kill the child: the kernel does (Linux)."""
    import ctypes  # lazy: the child's only

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it died before the prctl
        os._exit(1)


def _import_torch_yielding() -> None:
    """import torch (the long part, beside the parent's start) in a thread of lower priority (Linux's nice is per
    thread): on a busy machine the parent's validation goes first, so an invalid file's error is not delayed by a
    model it will not need; the model itself then loads, and generates, at the process's own priority."""
    # torch's out-of-tree device plugins (the engine runs on cpu and cuda): their entry points are not scanned
    os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

    def low_priority_import() -> None:
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, 0) + IMPORT_NICE)
        import torch  # noqa: F401

    thread = threading.Thread(target=low_priority_import, name="import-torch")
    thread.start()
    thread.join()


def _load(conn: Connection, load):
    from batchinfer.runtime import engine_messages as msg  # lazy: this module loads first, before the fork
    from batchinfer.runtime.engine_host import get_generator  # lazy: the engine host loads the model

    notes = io.StringIO()
    try:
        with contextlib.redirect_stderr(notes):
            generator = get_generator(load.settings)
    except Exception as exc:  # noqa: BLE001 - the parent raises it again, as a one-process run would have
        conn.send(msg.Failed.of(exc))
        return None
    conn.send(msg.Loaded(generator.description, notes.getvalue(), hasattr(generator, "step_stats")))
    return generator


def _answer(conn: Connection, generator) -> None:
    from batchinfer.runtime import engine_messages as msg  # lazy: this module loads first, before the fork

    while True:
        ask = conn.recv()
        if isinstance(ask, msg.AskStepStats):
            conn.send(generator.step_stats)
        elif isinstance(ask, msg.Generate):
            conn.send(_generate(conn, generator, ask.requests))


def _generate(conn: Connection, generator, requests):
    from batchinfer.runtime import engine_messages as msg  # lazy: this module loads first, before the fork

    aborted: set[str] = set()

    def aborts() -> set[str]:  # asked each engine step: the parent's aborts arrive while the engine runs
        while conn.poll(0):
            aborted.update(conn.recv().request_ids)
        return aborted

    try:
        return msg.Returned(generator.generate(requests, on_result=lambda r: conn.send(msg.Result(r)), aborts=aborts))
    except Exception as exc:  # noqa: BLE001 - the unit runner handles it in the parent, as it would here
        return msg.Failed.of(exc)
