"""Two models in one fleet, end to end: a `batchinfer serve` process and two real Celery workers, one serving
SmolLM2 (BATCHINFER_MODEL's default) and one a tiny random Llama checkpoint made here by transformers
(`worker --model PATH --model-id NAME`), on PostgreSQL, Redis and S3. The API knows the tiny model only from its
worker's announcement; BATCHINFER_MODELS names a third model no worker serves."""
from __future__ import annotations

import json
import uuid

import httpx
import pytest

from benchmarks.support.services import free_port, start_cli, stop
from cli_helpers import batchinfer, cli_env, wait_for, wait_healthy
from jobfiles import chat_line

SMOL, TINY, GHOST = "smollm2-135m-instruct", "tiny-llama", "ghost"
FINAL = ("completed", "failed", "cancelled", "expired")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny random Llama checkpoint (safetensors, tokenizer, chat template), written by transformers."""
    from tests.engine.tiny_families import build_family_checkpoint

    return build_family_checkpoint("llama", tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, checkpoint, model_cache, postgres_server, redis_server, s3_server, s3_bucket):
    """(base URL, admin headers, worker names by model, database URL, env, folder of the logs)."""
    import psycopg

    root = tmp_path_factory.mktemp("fleet")
    db = f"batchinfer_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{db}"')
    db_url = postgres_server.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://") + f"/{db}"
    env = cli_env(root, model_cache, BATCHINFER_DATABASE_URL=db_url,
                  BATCHINFER_STORAGE_URL=f"s3://{s3_bucket}/fleet-{uuid.uuid4().hex[:8]}",
                  BATCHINFER_BROKER_URL=f"{redis_server}/0", BATCHINFER_BROKER_PREFIX=f"bitest-{uuid.uuid4().hex[:8]}:",
                  BATCHINFER_DISPATCH_COUNTDOWN_S="0.3",
                  BATCHINFER_MODELS=json.dumps({GHOST: str(root / "nowhere")}), **s3_server)
    assert batchinfer(env, "db", "upgrade").returncode == 0
    names = {SMOL: f"smol-{uuid.uuid4().hex[:6]}", TINY: f"tiny-{uuid.uuid4().hex[:6]}"}
    procs = [start_cli(env, root / "smol.log", "worker", "--name", names[SMOL]),
             start_cli(env, root / "tiny.log", "worker", "--name", names[TINY], "--model", str(checkpoint),
                       "--model-id", TINY)]
    port = free_port()
    procs.append(start_cli(env, root / "server.log", "serve", "--port", str(port)))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(procs[-1], url, root / "server.log")
        made = batchinfer(env, "keys", "create", "--name", "ops", "--admin", "--json")
        assert made.returncode == 0, made.stderr
        headers = {"Authorization": f"Bearer {json.loads(made.stdout)['key']}"}
        wait_for(lambda: {m["id"] for m in _models(url, headers) if m["live"]} == {SMOL, TINY}, "both workers live", 240, 1)
        yield url, headers, names, db_url, env, root
    finally:
        for proc in procs:
            stop(proc)
        for log in ("smol.log", "tiny.log", "server.log"):
            assert "Traceback" not in (root / log).read_text(errors="replace"), f"traceback in {log}"
        with psycopg.connect(postgres_server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


def _models(url: str, headers: dict) -> list[dict]:
    answer = httpx.get(f"{url}/v1/models", headers=headers)
    assert answer.status_code == 200, answer.text
    return answer.json()["data"]


def _create(url: str, headers: dict, lines: list[str]) -> str:
    upload = httpx.post(f"{url}/v1/files", headers=headers, data={"purpose": "batch"},
                        files={"file": ("batch.jsonl", ("\n".join(lines) + "\n").encode())})
    assert upload.status_code == 200, upload.text
    batch = httpx.post(f"{url}/v1/batches", headers=headers, json={
        "input_file_id": upload.json()["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"})
    assert batch.status_code == 200, batch.text
    return batch.json()["id"]


def _final(url: str, headers: dict, batch_id: str) -> dict:
    def ended():
        batch = httpx.get(f"{url}/v1/batches/{batch_id}", headers=headers).json()
        return batch if batch["status"] in FINAL else None
    return wait_for(ended, f"batch {batch_id} to end", 240, 0.5)


def _output(url: str, headers: dict, batch: dict) -> list[dict]:
    answer = httpx.get(f"{url}/v1/files/{batch['output_file_id']}/content", headers=headers)
    assert answer.status_code == 200, answer.text
    return [json.loads(line) for line in answer.text.splitlines()]


def _units(db_url: str) -> list[tuple[str, str, str]]:
    """(model, worker, job id) of every request's unit, from the database."""
    import psycopg

    with psycopg.connect(db_url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        return conn.execute("SELECT u.model, u.worker, r.job_id FROM work_units u JOIN requests r ON r.unit_id = u.id").fetchall()


def test_two_models_run_each_on_its_own_workers(fleet):
    url, headers, names, db_url, env, root = fleet
    listed = {m["id"]: (m["live"], m["configured"]) for m in _models(url, headers)}
    assert listed == {SMOL: (True, True), TINY: (True, False), GHOST: (False, True)}

    def lines(model: str, tag: str) -> list[str]:
        return [chat_line(f"{tag}-{i}", prompt, max_tokens=2, model=model) for i, prompt in enumerate(["Name a fruit.", "Hello!"])]

    ids = {SMOL: _create(url, headers, lines(SMOL, "s")), TINY: _create(url, headers, lines(TINY, "t"))}
    unserved = _create(url, headers, [chat_line("x", "hi", model="gpt-4o")])
    batches = {model: _final(url, headers, batch_id) for model, batch_id in ids.items()}
    for model, batch in batches.items():
        assert batch["status"] == "completed" and batch["model"] == model, batch
        outputs = _output(url, headers, batch)
        assert len(outputs) == 2 and {o["response"]["body"]["model"] for o in outputs} == {model}
        assert {o["metrics"]["worker"] for o in outputs} == {names[model]}
    units = _units(db_url)
    assert {(m, w) for m, w, _ in units} == {(SMOL, names[SMOL]), (TINY, names[TINY])}
    assert all(job == ids[model] for model, _, job in units)  # a unit holds one model's batch only

    refused = _final(url, headers, unserved)
    assert refused["status"] == "failed" and refused["model"] == "gpt-4o"
    (error,) = refused["errors"]["data"]
    assert (error["code"], error["line"], error["param"]) == ("model_not_found", 1, "body.model")
    assert error["message"] == ("The provided model 'gpt-4o' is not supported by the Batch API (served here: "
                                f"'{GHOST}', '{SMOL}', '{TINY}').")

    metrics = httpx.get(f"{url}/metrics", headers=headers).text
    assert f'batchinfer_worker_model{{model="{TINY}",worker="{names[TINY]}"}} 1.0' in metrics
    assert f'batchinfer_model_batches{{model="{TINY}",status="completed"}} 1.0' in metrics
    workers = httpx.get(f"{url}/v1/dashboard/workers", headers=headers).json()["data"]
    assert {w["name"]: w["model"] for w in workers if w["alive"]} == {names[SMOL]: SMOL, names[TINY]: TINY}


def test_a_unit_sent_to_a_worker_of_another_model_goes_on_to_its_own(fleet):
    """A message that reaches the wrong model's worker (one from before fleets, a path that knows no models)
    is passed on to the unit's model queue, never run on the wrong model."""
    from batchinfer.jobs.dispatch.routing import worker_queue
    from batchinfer.settings import Settings
    from workers.celery_app import make_app
    from workers.tasks import RUN_UNIT_TASK

    url, headers, names, db_url, env, root = fleet
    (unit_id,) = {u for m, u in _unit_ids(db_url) if m == TINY}
    settings = Settings(broker_url=env["BATCHINFER_BROKER_URL"], broker_prefix=env["BATCHINFER_BROKER_PREFIX"])
    seen = (root / "tiny.log").read_text().count(unit_id)  # Celery logs each run's result, which names the unit
    make_app(settings).send_task(RUN_UNIT_TASK, args=[unit_id], queue=worker_queue(names[SMOL]))
    wait_for(lambda: f"unit {unit_id} is for model {TINY}, not this worker's" in (root / "smol.log").read_text(),
             "the smol worker to pass the unit on", 60, 0.5)
    wait_for(lambda: (root / "tiny.log").read_text().count(unit_id) > seen, "the tiny worker to run it again", 60, 0.5)


def _unit_ids(db_url: str) -> list[tuple[str, str]]:
    import psycopg

    with psycopg.connect(db_url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        return conn.execute("SELECT model, id FROM work_units").fetchall()


def test_run_takes_any_checkpoint_embedded_under_the_model_its_lines_name(checkpoint, model_cache, tmp_path):
    src, out = tmp_path / "batch.jsonl", tmp_path / "out.jsonl"
    src.write_text("\n".join(chat_line(f"r{i}", "Hello!", max_tokens=3, model="my-tiny") for i in range(2)) + "\n")
    ran = batchinfer(cli_env(tmp_path, model_cache), "run", str(src), "-o", str(out), "--model", str(checkpoint))
    assert ran.returncode == 0, ran.stderr
    outputs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [o["response"]["body"]["model"] for o in outputs] == ["my-tiny", "my-tiny"]
    assert all(o["response"]["body"]["usage"]["completion_tokens"] >= 1 for o in outputs)
