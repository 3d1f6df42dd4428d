"""`python -m benchmarks ...`: the benchmarks without the product CLI."""
from .cli import app

if __name__ == "__main__":
    app(prog_name="python -m benchmarks")
