"""`python -m batchinfer.cli`: the same CLI as the `batchinfer` command."""
from batchinfer.cli.main import main

main()
