"""Assembly merges the units' result files, invalid lines and closed requests into two files in input order,
however many units there are (merged in rounds past MAX_OPEN). The null engine runs the units: fast tier."""
import pytest

from batchinfer.jobs import service
from batchinfer.jobs.finalize import assembly
from batchinfer.jobs.dispatch.planning import dispatch
from batchinfer.runtime.engine_host import get_generator
from batchinfer.jobs.units.runner import run_unit
from jobfiles import chat_line, read_output, submit_lines

pytestmark = pytest.mark.fast


@pytest.mark.parametrize("max_open", [2, 256])
def test_output_and_errors_come_out_in_input_order_from_many_units(make_context, monkeypatch, max_open):
    monkeypatch.setattr(assembly, "MAX_OPEN", max_open)
    ctx = make_context(engine="null", max_requests_per_unit=3, prefix_grouping=False)
    lines = [chat_line(f"c{i}", f"question {i}") for i in range(20)]
    lines[4] = "[]"
    lines[13] = "{broken"
    job = submit_lines(ctx, lines, skip_invalid=True)
    units = dispatch(ctx)
    assert len(units) == 6
    generator = get_generator(ctx.settings)
    for unit in units[:4]:
        run_unit(ctx, unit.unit_id, generator, "w")
    job = service.cancel(ctx, job.id)  # the last two units' requests end batch_cancelled
    assert job.status == "cancelled"
    out, errors = read_output(ctx, job.id), read_output(ctx, job.id, errors=True)
    assert [o["custom_id"] for o in out] == [f"c{i}" for i in range(20) if i not in (4, 13)][:12]
    assert [(e["error"]["line"], e["error"]["code"]) for e in errors] == (
        [(5, "invalid_request"), (14, "invalid_json_line")]
        + [(line, "batch_cancelled") for line in range(15, 21)])
    assert job.completed == 12 and job.failed == 2 + 6
