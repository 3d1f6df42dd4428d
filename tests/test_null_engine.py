"""The null engine (BATCHINFER_ENGINE=null): selected only by name, never the default, and run through the
same Generator path the real engine takes (engine_host.get_generator, run_unit)."""
import os

import pytest
from pydantic import ValidationError

from batchinfer.jobs.dispatch.planning import dispatch
from batchinfer.runtime.engine_host import get_generator
from batchinfer.runtime.null_generator import NullGenerator
from batchinfer.jobs.units.runner import run_unit
from batchinfer.settings import Settings
from jobfiles import chat_line, read_output, submit_lines

pytestmark = pytest.mark.fast


def test_the_default_engine_is_never_the_null_engine(monkeypatch):
    for name in [n for n in os.environ if n.startswith("BATCHINFER_")]:
        monkeypatch.delenv(name)
    assert Settings().engine == "batchinfer"


@pytest.mark.parametrize("spelling", ["Null", "none", "nul", ""])
def test_a_null_engine_not_named_exactly_is_refused(spelling):
    with pytest.raises(ValidationError, match="BATCHINFER_ENGINE must be"):
        Settings(engine=spelling)


def test_the_null_engine_answers_each_request_with_one_token_through_the_unit_runner(make_context):
    ctx = make_context(engine="null")
    generator = get_generator(ctx.settings)
    assert isinstance(generator, NullGenerator)
    job = submit_lines(ctx, [chat_line(f"c{i}", f"question {i}", max_tokens=5) for i in range(3)])
    (unit,) = dispatch(ctx)
    outcome = run_unit(ctx, unit.unit_id, generator, "null-worker")
    assert outcome.committed and outcome.completed == 3 and outcome.finalized_jobs == (job.id,)
    out = read_output(ctx, job.id)
    assert [o["custom_id"] for o in out] == ["c0", "c1", "c2"]
    assert {o["response"]["body"]["usage"]["completion_tokens"] for o in out} == {1}
    assert all(o["response"]["body"]["usage"]["prompt_tokens"] > 0 for o in out)
