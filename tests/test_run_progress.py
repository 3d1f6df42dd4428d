"""`batchinfer run`'s progress bar counts its own job only: the in-process run also takes up other jobs' units
waiting in the same data directory (a second `run` beside it, an interrupted one), and two runs side by side once
showed "16/8"."""
from __future__ import annotations

import io

from rich.console import Console

from batchinfer.cli.progress import RunProgress
from batchinfer.engine.types import GenerationResult
from batchinfer.jobs.records import RequestKey


def _result(key: RequestKey, tokens: int) -> GenerationResult:
    return GenerationResult(key.engine_id, list(range(tokens)), "x" * tokens, "stop", 3, 0, 0.0, 0.0, 0.0, 0.0)


def test_only_the_runs_own_job_moves_its_bar():
    out = io.StringIO()
    with RunProgress(Console(file=out, width=100), total=2, job_id="batch_mine") as bar:
        bar.loaded()
        for job_id, index in (("batch_mine", 0), ("batch_other", 0), ("batch_other", 1), ("batch_mine", 1)):
            key = RequestKey(job_id, index)
            bar.on_result(key, _result(key, tokens=5))
        task = bar.progress.tasks[0]
        assert (task.completed, task.total, bar.tokens) == (2, 2, 10)
    assert "2/2" in out.getvalue() and "4/2" not in out.getvalue()
