"""`batchinfer bench <benchmark> ...`: the one door from the product CLI to the benchmarks package. The product
does not depend on it (import-linter), so it is found at run time and, when missing, named with how to install it."""
from __future__ import annotations

import importlib
import importlib.util

import typer

BENCH_EXTRA = "the benchmarks are not installed: from a checkout, pip install -e '.[bench]'"


def bench_command(ctx: typer.Context) -> None:
    """Benchmarks (compare, grouping, api, process, startup, load, pipeline, plan, constrained); `batchinfer bench --help` lists them."""
    if any(importlib.util.find_spec(name) is None for name in ("benchmarks", "matplotlib")):
        typer.echo(BENCH_EXTRA, err=True)
        raise typer.Exit(1)
    # a module name in a string: the benchmarks stay out of the product's import graph
    bench_app = importlib.import_module("benchmarks.cli").app
    bench_app(args=ctx.args, prog_name="batchinfer bench")
