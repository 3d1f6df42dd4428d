"""The autoscaler's signals (jobs.views.backlog): per model, requests pending and running and the age of the oldest
waiting batch, in GET /v1/models' objects and in /metrics. Tiny tokenizer folders, SQLite and local files."""
from __future__ import annotations

import pytest

from batchinfer.api.app import model_list
from batchinfer.api.metrics import _JobCollector
from batchinfer.jobs.dispatch.planning import dispatch
from batchinfer.jobs.state import units
from batchinfer.jobs.views.backlog import Backlog, model_backlogs
from jobfiles import completion_line, submit_lines
from tiny_model import build_tiny_model

pytestmark = pytest.mark.fast
DEFAULT, OTHER, IDLE = "smollm2-135m-instruct", "tiny-2", "tiny-3"


@pytest.fixture
def fleet(make_context, tmp_path):
    return make_context(models={OTHER: str(build_tiny_model(tmp_path / "other")),
                                IDLE: str(build_tiny_model(tmp_path / "idle"))})


def test_each_model_counts_its_pending_and_running_requests_and_the_age_of_its_oldest_batch(fleet):
    first = submit_lines(fleet, [completion_line(f"a{i}", f"Item {i}:") for i in range(3)])
    submit_lines(fleet, [completion_line(f"b{i}", f"Other {i}:", model=OTHER) for i in range(2)])
    (unit,) = [u for u in dispatch(fleet) if u.queue.endswith(OTHER)]
    assert units.start_unit(fleet, unit.unit_id, "w1") is not None  # OTHER's requests run now
    with fleet.sessions() as session:
        found = model_backlogs(session, now=first.queued_at + 30)
    assert found[DEFAULT] == Backlog(pending=3, running=0, oldest_pending_s=pytest.approx(30, abs=0.01))
    assert found[OTHER] == Backlog(pending=0, running=2, oldest_pending_s=0.0)  # nothing of it waits
    assert IDLE not in found


def test_v1_models_and_metrics_show_every_served_models_backlog_idle_ones_at_zero(fleet):
    submit_lines(fleet, [completion_line(f"a{i}", f"Item {i}:") for i in range(2)])
    listed = {m["id"]: m for m in model_list(fleet)}
    assert (listed[DEFAULT]["pending_requests"], listed[DEFAULT]["running_requests"]) == (2, 0)
    assert listed[DEFAULT]["oldest_pending_s"] >= 0
    assert (listed[IDLE]["pending_requests"], listed[IDLE]["oldest_pending_s"]) == (0, 0.0)
    families = {f.name: f for f in _JobCollector(fleet).collect()}
    pending = {s.labels["model"]: s.value for s in families["batchinfer_model_requests_pending"].samples}
    assert pending[DEFAULT] == 2 and pending[IDLE] == 0 and pending[OTHER] == 0
