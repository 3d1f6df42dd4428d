"""`python -m batchinfer.cli`: the same CLI as the `batchinfer` command."""
from batchinfer.cli.app import app

app(prog_name="batchinfer")
