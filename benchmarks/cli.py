"""`batchinfer bench <benchmark>` (or `python -m benchmarks <benchmark>`): every benchmark, one sub-command each.
The product CLI hands its `bench` arguments to this app; it is installed with the `[bench]` extra."""
import typer

from .api import bench_api_command
from .command import bench
from .constrained import bench_constrained_command
from .fidelity import bench_fidelity_command
from .gguf_model import bench_make_model_command
from .grouping import bench_grouping_command
from .load_command import bench_load_command
from .pipeline_command import bench_pipeline_command
from .plan_accuracy import bench_plan_command
from .process_command import bench_process_command
from .startup_command import bench_startup_command

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Benchmarks of batchinfer (the `[bench]` extra).")
app.command("compare")(bench)
app.command("grouping")(bench_grouping_command)
app.command("api")(bench_api_command)
app.command("process")(bench_process_command)
app.command("startup")(bench_startup_command)
app.command("load")(bench_load_command)
app.command("pipeline")(bench_pipeline_command)
app.command("plan")(bench_plan_command)
app.command("constrained")(bench_constrained_command)
app.command("make-model")(bench_make_model_command)
app.command("fidelity")(bench_fidelity_command)
