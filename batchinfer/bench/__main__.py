"""`python -m batchinfer.bench ...`: the bench command without the rest of the CLI."""
import typer

from .command import bench

if __name__ == "__main__":
    typer.run(bench)
