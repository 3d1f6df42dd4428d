"""`batchinfer bench <benchmark>` (or `python -m benchmarks <benchmark>`): every benchmark, one sub-command each.
The product CLI hands its `bench` arguments to this app; it is installed with the `[bench]` extra."""
import functools

import typer

from .adapters import bench_adapters_command
from .api import bench_api_command
from .command import bench
from .constrained import bench_constrained_command
from .fidelity import bench_fidelity_command
from .formats import bench_formats_command
from .gguf_model import bench_make_model_command
from .grouping import bench_grouping_command
from .load_command import bench_load_command
from .pipeline_command import bench_pipeline_command
from .plan_accuracy import bench_plan_command
from .process_command import bench_process_command
from .startup_command import bench_startup_command
from .tool_lines import bench_tools_command
from .support.prerequisites import Missing

PACKAGES = {"llama_cpp": "make llamacpp (a source build of llama.cpp and its Python binding)"}


def missing_in_one_line(command):
    """A prerequisite that is not there (a binary, a server, an optional package) ends the benchmark in one line
    naming it, not in a traceback."""
    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except Missing as exc:
            problem = str(exc)
        except ModuleNotFoundError as exc:
            how = PACKAGES.get(exc.name or "", "pip install -e '.[bench]' from a checkout")
            problem = f"the Python package `{exc.name}` is not installed: {how}"
        except FileNotFoundError as exc:
            if exc.filename is None or "/" in str(exc.filename):  # a file of the benchmark's, not a program
                raise
            problem = f"the `{exc.filename}` binary is not on PATH"
        typer.echo(f"error: {problem}", err=True)
        raise typer.Exit(1)
    return wrapper


app = typer.Typer(no_args_is_help=True, add_completion=False, help="Benchmarks of batchinfer (the `[bench]` extra).")
for name, command in (("compare", bench), ("grouping", bench_grouping_command), ("api", bench_api_command),
                      ("process", bench_process_command), ("startup", bench_startup_command),
                      ("load", bench_load_command), ("pipeline", bench_pipeline_command), ("plan", bench_plan_command),
                      ("constrained", bench_constrained_command), ("tools", bench_tools_command),
                      ("make-model", bench_make_model_command), ("fidelity", bench_fidelity_command),
                      ("formats", bench_formats_command), ("adapters", bench_adapters_command)):
    app.command(name)(missing_in_one_line(command))
