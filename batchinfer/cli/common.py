"""What every command group shares: the consoles, one-line errors, the context a command runs in (its settings
with the command line's options over them), and the API client when the CLI talks HTTP only."""
from __future__ import annotations

import functools
import sys
from pathlib import Path

import typer
from pydantic import ValidationError
from rich.console import Console

from batchinfer.cluster.registry import live_models_reader
from batchinfer.context import AppContext
from batchinfer.db.session import is_transient_db
from batchinfer.errors import BatchInferError, excerpt, shown
from batchinfer.settings import check_model_id, get_settings, set_command_line

# No emoji codes: ':smile:' in a custom_id or a file name prints as typed (markup is off per call, or Text).
out = Console(emoji=False)
err = Console(stderr=True, soft_wrap=True, emoji=False)
JSON_HELP = "print JSON (the Batch object, as the API returns it) for scripts"
EXIT_INVALID_INPUT = 2
DTYPE_HELP = "engine dtype: auto (float32 unless another is invariant, faithful and faster here), float32 or bfloat16"
MODEL_HELP = "checkpoint to serve: a Hugging Face folder or a .gguf file (default: BATCHINFER_MODEL, else SmolLM2)"
MODEL_ID_HELP = "the name batches use for --model (default: the folder's or file's name)"


def say(text: str) -> None:
    """A line for people on stderr (user text in it is data, never markup)."""
    err.print(text, markup=False, highlight=False)


def friendly_errors(command):
    """Errors reach people as one line on stderr and a non-zero exit code, never as a traceback."""
    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            try:
                return command(*args, **kwargs)
            finally:
                sys.stdout.flush()  # a reader that went away (`| head`) shows here, not in a warning at exit
        except (typer.Exit, typer.Abort):
            raise
        except BrokenPipeError:
            out.on_broken_pipe()  # as rich does for its own output: stdout to /dev/null, exit 1, no message
        except BatchInferError as exc:
            say(f"error: {exc}")
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt as exc:
            say(f"interrupted: {exc}" if str(exc) else "interrupted")
            raise typer.Exit(130) from None
        except Exception as exc:  # noqa: BLE001 - the last line of defence for people
            if is_transient_db(exc):
                say("error: waiting for the database: it does not answer; batches resume by themselves once it is "
                    "back (nothing fails for it)")
                raise typer.Exit(1) from None
            say(excerpt(f"error: {type(exc).__name__}: {exc}".splitlines()[0]))
            raise typer.Exit(1) from None
    return wrapper


def context(embedded: bool = False) -> AppContext:
    """The command's context: embedded forces this process to run what it submits (no broker)."""
    try:
        settings = get_settings()
    except ValidationError as exc:
        raise _invalid_setting(exc) from None
    if embedded:
        settings = settings.model_copy(update={"broker_url": None})
    ctx = AppContext.create(settings)
    ctx.live_models = live_models_reader(settings)  # None in the embedded mode
    return ctx


def _invalid_setting(exc: ValidationError) -> BatchInferError:
    """One line naming the variable: our validators' messages name it themselves, pydantic's own do not."""
    error = exc.errors()[0]
    ours = error.get("ctx", {}).get("error")
    if isinstance(ours, ValueError):
        return BatchInferError(f"invalid setting: {ours}")
    name = "BATCHINFER_" + "_".join(str(part) for part in error["loc"]).upper()
    return BatchInferError(f"invalid setting: {name}: {error['msg']}, got {shown(error.get('input'))}")


def _command_line(**values) -> None:
    try:
        set_command_line(**values)
    except ValidationError as exc:
        raise _invalid_setting(exc) from None


def force_dtype(dtype: str | None) -> None:
    """--dtype wins over BATCHINFER_DTYPE, for everything this process runs."""
    if dtype is not None:
        _command_line(dtype=dtype)


def force_model(model: Path | None, model_id: str | None, fallback_id: str | None = None) -> None:
    """--model / --model-id win over BATCHINFER_MODEL / BATCHINFER_MODEL_ID, for everything this process runs.
    The id of a --model without --model-id: fallback_id, else its folder's or file's name."""
    if model is None and model_id is None:
        return
    chosen: dict[str, str] = {}
    if model is not None:
        if not model.exists():
            raise BatchInferError(f"--model: no file or folder {shown(str(model))}")
        chosen["model"] = str(model.resolve())
        model_id = model_id or fallback_id or model.stem
    if model_id is not None:
        try:
            chosen["model_id"] = check_model_id(model_id, "--model-id")
        except ValueError as exc:
            raise BatchInferError(str(exc)) from None
    _command_line(**chosen)


def client():
    """The API client when BATCHINFER_API_URL is set (the CLI then talks HTTP only), else None."""
    settings = get_settings()
    if not settings.api_url:
        return None
    from batchinfer.cli.client import ApiClient  # lazy: httpx, which only the HTTP mode needs

    return ApiClient(settings.api_url, settings.api_key, submit_wait_s=settings.api_submit_wait_s)


def open_input(path: Path):
    if not path.is_file():
        raise BatchInferError(f"no such file: {path}")
    return open(path, "rb")
