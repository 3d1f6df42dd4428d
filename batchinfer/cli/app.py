"""`batchinfer`: a thin Typer layer that parses, calls the job service, and prints (a table, or --json). Each
command group lives in its own module; this one puts them together."""
from __future__ import annotations

import typer

from batchinfer.cli import batches, pausing, services, submit
from batchinfer.cli.bench_command import bench_command
from batchinfer.cli.keys import keys_app

app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False, rich_markup_mode=None,
                  help="Batch LLM inference: hand over a JSONL file of requests, get a JSONL file of results.")
for command in (submit.submit, submit.plan, batches.status):
    app.command()(command)
app.command("list")(batches.list_)
for command in (batches.cancel, pausing.pause, pausing.resume, batches.download, submit.run, services.worker, services.serve):
    app.command()(command)
app.add_typer(services.db_app, name="db")
app.add_typer(keys_app, name="keys")
app.command("bench", add_help_option=False,
            context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(bench_command)
app.command("retry")(submit.retry)


def main() -> None:
    app()
