"""Fleets that come and go (issue 41): a fleet with no worker still ends every job on time, because
`batchinfer serve` runs the sweep and webhook delivery (runtime.control_plane)."""
from __future__ import annotations

import json
import signal
import time
from collections import Counter

import pytest

from batchinfer.jobs import service
from faultlib import record_recovery, slow_lines, wait_for
from webhook_receiver import Receiver

WINDOW_S = 45
HOOKS = {"BATCHINFER_WEBHOOK_SECRET": "whsec_fleets", "BATCHINFER_WEBHOOK_ALLOW_PRIVATE": "true",
         "BATCHINFER_WEBHOOK_POLL_S": "0.5"}


def _live_workers(c) -> list[str]:
    return [w.name for w in c.registry().live()]


def test_with_no_worker_left_a_job_expires_on_time_keeps_what_finished_and_its_webhook_goes_out(fault_cluster):
    receiver = Receiver()
    try:
        c = fault_cluster(**HOOKS)
        c.context()  # the schema, before the server starts
        c.serve()
        c.start("w1")
        lines = slow_lines("z", 6)
        job_id = c.submit(lines, completion_window=f"{WINDOW_S}s", metadata={"webhook_url": receiver.url})
        wait_for(lambda: any(u.status == "done" for u in c.units()), 180, "a first unit committed", every=0.05)
        c.kill("w1")  # the whole fleet gone (a spot reclaim): nobody runs the rest
        wait_for(lambda: not _live_workers(c), 30, "the registry to see no live worker")
        job = c.wait_final(job_id, timeout=WINDOW_S + 90)
        assert not _live_workers(c)
        outputs, errors = c.check(job, lines, "expired")
        assert len(outputs) >= 2, len(outputs)  # the unit that committed before the fleet left is kept
        assert {e["error"]["code"] for e in errors} == {"batch_expired"}, errors
        late = job.expired_at - job.expires_at
        assert 0 <= late < 60, late  # the bound; the sweep's interval is what it takes here
        wait_for(lambda: receiver.acknowledged(), 30, "the batch.expired webhook")
        event = json.loads(receiver.acknowledged()[0].body)
        assert event["type"] == "batch.expired" and event["data"]["id"] == job_id, event
        record_recovery("zero workers past the completion window (expiry lateness)", late, kept=len(outputs))
    finally:
        receiver.close()


def test_a_cancel_that_met_a_storage_outage_with_no_worker_ends_cancelled_once_storage_is_back(fault_cluster,
                                                                                                private_s3):
    c = fault_cluster(s3=private_s3, BATCHINFER_OUTAGE_BACKOFF_S="1")
    c.s3_env = {**c.s3_env, "AWS_MAX_ATTEMPTS": "2"}  # each try short: the server's retries come fast
    c.context()  # the schema, before the server starts
    c.serve()
    lines = slow_lines("k", 4)
    job_id = c.submit(lines)  # no worker ever: its requests stay pending
    private_s3.kill()
    job = service.cancel(c.context(), job_id)  # its finalize cannot write the files: retried later
    assert job.status in ("cancelling", "finalizing"), job.status
    time.sleep(3)
    assert service.get(c.context(), job_id).status in ("cancelling", "finalizing")
    back_at = time.time()
    private_s3.start()
    job = c.wait_final(job_id, timeout=120)
    assert not _live_workers(c)
    _, errors = c.check(job, lines, "cancelled")
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    record_recovery("cancel during a storage outage, no worker (storage back -> cancelled)", job.cancelled_at - back_at)


def long_lines(prefix: str, n: int, longest: int) -> list[str]:
    """Requests of many lengths (ignore_eos: each runs exactly its max_tokens), so at any moment some are done."""
    return [json.dumps({"custom_id": f"{prefix}-{i}", "method": "POST", "url": "/v1/completions",
                        "body": {"model": "smollm2-135m-instruct", "prompt": f"{prefix} item {i}:", "temperature": 0,
                                 "max_tokens": max(2, longest * (i + 1) // n), "ignore_eos": True}}) for i in range(n)]


def _finished_so_far(c, unit_id: str) -> int:
    from sqlalchemy import func, select

    from batchinfer.db.models import UnitProgress

    with c.context().sessions() as session:
        return session.scalar(select(func.coalesce(func.sum(UnitProgress.completed), 0))
                              .where(UnitProgress.unit_id == unit_id)) or 0


def test_sigterm_mid_unit_drains_commits_what_finished_and_a_peer_runs_only_the_rest(fault_cluster):
    drain_s = 3.0
    c = fault_cluster(BATCHINFER_DRAIN_S=str(drain_s), BATCHINFER_MAX_REQUESTS_PER_UNIT="16")
    c.start("w1", "w2")
    lines = long_lines("d", 16, longest=400)
    job_id = c.submit(lines)
    victim = c.wait_unit_running()
    wait_for(lambda: _finished_so_far(c, victim.id) >= 2, 180, "a few requests of the unit finished", every=0.1)
    signalled_at = time.time()
    c.signal(victim.worker, signal.SIGTERM)
    code = c.procs[victim.worker].wait(drain_s + 30)
    drained_in = time.time() - signalled_at
    assert code == 0, c.log_tail(victim.worker)
    assert drained_in < drain_s + 15, drained_in  # the engine stops by the deadline; commit and exit follow
    job = c.wait_final(job_id, timeout=300)
    outputs, _ = c.check(job, lines, "completed", expect_completed=16)
    by_worker = Counter(o["metrics"]["worker"] for o in outputs)
    kept = by_worker[victim.worker]
    assert 2 <= kept < 16, by_worker  # what finished before the drain is credited to the drained worker
    units = c.units()
    drained = next(u for u in units if u.id == victim.id)
    assert (drained.status, drained.attempts) == ("done", 1)  # committed, not rerun, no failed attempt
    rest = [u for u in units if u.id != victim.id]
    assert rest and all(u.worker != victim.worker for u in rest)
    assert sum(u.num_requests for u in rest) == 16 - kept  # the peer ran only what the drained unit gave back
    record_recovery("sigterm mid-unit (drain time: signal -> exit 0)", drained_in, kept=kept, given_back=16 - kept)


def _chunks(c, unit_id: str, attempt: int) -> list:
    from sqlalchemy import select

    from batchinfer.db.models import UnitChunk

    with c.context().sessions() as session:
        return list(session.scalars(select(UnitChunk).where(UnitChunk.unit_id == unit_id, UnitChunk.attempt == attempt)))


def _lines_run(c, unit_id: str, attempt: int) -> int:
    """Requests a run of the unit computed and kept: its chunk files and its own results file."""
    from batchinfer.jobs import record_store

    keys = [k.result_key for k in _chunks(c, unit_id, attempt)] + [record_store.unit_results(unit_id, attempt)]
    storage, lines = c.context().storage, 0
    for key in keys:
        if storage.exists(key):
            with storage.open_read(key) as stream:
                lines += stream.read().count(b"\n")
    return lines


@pytest.mark.parametrize("chunk_s", ["0", "1"])
def test_sigkill_mid_unit_reruns_only_what_no_chunk_holds(fault_cluster, chunk_s):
    """chunk_s 0 is the unit as it was (everything it finished is computed again); 1 keeps all but the last chunk."""
    c = fault_cluster(BATCHINFER_MAX_REQUESTS_PER_UNIT="16", BATCHINFER_CHUNK_S=chunk_s, BATCHINFER_CHUNK_REQUESTS="4",
                      BATCHINFER_PROGRESS_FLUSH_S="0.2")
    c.start("w1", "w2")
    lines = long_lines("s", 16, longest=300)
    job_id = c.submit(lines)
    victim = c.wait_unit_running()
    wait_for(lambda: sum(k.requests for k in _chunks(c, victim.id, 1)) + _finished_so_far(c, victim.id) >= 6, 240,
             "six requests of the unit finished", every=0.1)
    at_risk = _finished_so_far(c, victim.id)  # finished, not yet in a chunk: what a kill now loses
    killed_at = c.kill(victim.worker)
    chunked = _chunks(c, victim.id, 1)
    kept = sum(k.requests for k in chunked)
    job = c.wait_final(job_id, timeout=300)
    c.check(job, lines, "completed", expect_completed=16)  # every custom_id once, counts exact
    unit = next(u for u in c.units() if u.id == victim.id)
    assert unit.attempts == 2, unit.attempts
    assert _lines_run(c, victim.id, 2) == 16 - kept  # the rerun computed only what no chunk held
    since = max([k.committed_at for k in chunked], default=victim.started_at or killed_at)
    if chunk_s == "0":
        assert kept == 0
    else:
        assert kept >= 2 and at_risk <= 4 + 2, (kept, at_risk)  # at most about a chunk's worth was lost
    # engine seconds lost: since the last chunk (or the unit's start); requests lost: finished but in no chunk
    record_recovery(f"sigkill mid-unit of 16, chunk_s={chunk_s} (engine seconds lost)", killed_at - since,
                    requests_lost=at_risk, kept=kept)


def test_a_worker_whose_model_cannot_load_here_exits_in_one_line_before_taking_work(fault_cluster, tmp_path):
    c = fault_cluster()
    c.context()
    not_a_model = tmp_path / "not-a-model"  # a folder with no checkpoint: what a model that does not fit meets too
    not_a_model.mkdir()
    proc = c.start_cli("bad", "worker", "--name", "bad", "--model", str(not_a_model))
    assert proc.wait(180) == 1, c.log_tail("bad")
    said = [line for line in c.output("bad").splitlines() if line.startswith("error:")]
    assert len(said) == 1 and "cannot serve model not-a-model here, so it takes no work" in said[0], said
    assert "bad" not in [w.name for w in c.registry().live()]  # it never announced itself
    c.assert_no_traceback()
