"""Cache scopes: a job runs in its key's scope (or its org's, or `local`); through a real server and worker,
one scope's prompts never show in another's cached tokens or prefix groups, while keys of one org share."""
from __future__ import annotations

import json

import httpx
import pytest

from batchinfer.errors import BatchInferError
from batchinfer.jobs.tenancy import scopes, tenants
from cli_helpers import batchinfer
from jobfiles import submit_lines
import test_api
from test_api import client, jsonl, wait_final

SYSTEM = ("You are the archive assistant of the Harbour Museum. Answer in one short sentence, cite the catalogue "
          "number when you know it, never guess a date, and say so when an object is on loan to another museum. "
          "The collection holds ship models, maps, navigation instruments, letters of captains and harbour logs.")
api_server = test_api.api  # a fixture: this module's own `batchinfer serve` and worker

QUESTIONS = ["Where are the ship models?", "Who wrote the captains' letters?", "Is the sextant on loan?",
             "How old are the harbour logs?"]


def system_line(custom_id: str, question: str) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": "smollm2-135m-instruct", "max_tokens": 2, "temperature": 0,
                                "messages": [{"role": "system", "content": SYSTEM},
                                             {"role": "user", "content": question}]}})


def make_key(server, name: str, *extra: str) -> tuple[str, str]:
    made = batchinfer(server[1], "keys", "create", "--name", name, "--json", *extra)
    assert made.returncode == 0, made.stderr
    record = json.loads(made.stdout)
    return record["id"], record["key"]


def run_batch(server, secret: str, questions: list[str]):
    c = client(server, secret)
    upload = c.files.create(file=("in.jsonl", jsonl([system_line(f"q{i}", q) for i, q in enumerate(questions)])),
                            purpose="batch")
    return c, c.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")


def finished(server, secret: str, questions: list[str]):
    c, created = run_batch(server, secret, questions)
    batch = wait_final(c, created.id)
    assert batch.status == "completed", batch
    return batch


def prefix_groups(server, secret: str, batch_id: str) -> list[dict]:
    answer = httpx.get(f"{server[0]}/v1/batches/{batch_id}/prefix_groups", headers={"Authorization": f"Bearer {secret}"})
    assert answer.status_code == 200, answer.text
    return answer.json()["data"]


def cached(batch) -> int:
    return batch.usage.input_tokens_details.cached_tokens


def test_another_scope_finds_nothing_of_a_system_prompt_its_owner_finds_cached(api_server):
    _, owner = make_key(api_server, "scope-owner")
    _, other = make_key(api_server, "scope-other")
    first = finished(api_server, owner, QUESTIONS)
    assert cached(first) > 0  # its own requests share the system prompt
    probe = finished(api_server, other, QUESTIONS[:1])
    assert cached(probe) == 0
    assert [(g["requests"], g["cached_tokens"]) for g in prefix_groups(api_server, other, probe.id)] == [(1, 0)]
    again = finished(api_server, owner, QUESTIONS[1:2])  # the same line, in the owner's scope: the blocks are still there
    assert cached(again) > 0


def test_batches_queued_together_in_two_scopes_share_no_unit(api_server):
    _, owner = make_key(api_server, "together-owner")
    _, other = make_key(api_server, "together-other")
    questions = [f"{q} (ref {i})" for i, q in enumerate(QUESTIONS * 2)]
    (c_owner, b_owner), (c_other, b_other) = run_batch(api_server, owner, questions), \
        run_batch(api_server, other, questions[:1])
    done_owner, done_other = wait_final(c_owner, b_owner.id), wait_final(c_other, b_other.id)
    assert done_owner.status == done_other.status == "completed"
    assert cached(done_other) == 0
    assert [(g["requests"], g["shared_prefix_len"], g["cached_tokens"])
            for g in prefix_groups(api_server, other, b_other.id)] == [(1, 0, 0)]
    assert sum(g["requests"] for g in prefix_groups(api_server, owner, b_owner.id)) == len(questions)


def test_keys_of_one_org_share_the_prefix_cache(api_server):
    _, first_key = make_key(api_server, "org-first", "--org", "harbour")
    second_id, second_key = make_key(api_server, "org-second")
    moved = batchinfer(api_server[1], "keys", "set-org", second_id, "harbour")
    assert moved.returncode == 0 and "harbour" in moved.stdout, moved.stderr
    finished(api_server, first_key, [f"{q} (first)" for q in QUESTIONS[:2]])
    assert cached(finished(api_server, second_key, [QUESTIONS[2]])) > 0


def test_a_bad_org_name_is_refused_in_one_line(api_server):
    made = batchinfer(api_server[1], "keys", "create", "--name", "x", "--org", "no spaces/here")
    assert made.returncode != 0 and "invalid org name" in made.stderr and "Traceback" not in made.stderr


@pytest.mark.fast
def test_a_job_runs_in_its_keys_scope_its_orgs_or_the_direct_one(make_context):
    ctx = make_context()
    alone, _ = tenants.create_key(ctx, "alone")
    member, _ = tenants.create_key(ctx, "member", org="acme")
    lines = [system_line("a", QUESTIONS[0])]
    assert submit_lines(ctx, lines).cache_scope == scopes.LOCAL
    assert scopes.job_scope(ctx, alone.id) == f"key:{alone.id}"
    assert scopes.job_scope(ctx, member.id) == "org:acme"
    tenants.set_org(ctx, alone.id, "acme")
    assert scopes.job_scope(ctx, alone.id) == "org:acme"
    tenants.set_org(ctx, alone.id, None)
    assert scopes.job_scope(ctx, alone.id) == f"key:{alone.id}"
    with pytest.raises(BatchInferError, match="invalid org name"):
        tenants.set_org(ctx, alone.id, "../x")


@pytest.mark.fast
def test_direct_jobs_join_the_org_an_operator_names(make_context):
    ctx = make_context(direct_job_org="acme")
    assert submit_lines(ctx, [system_line("a", QUESTIONS[0])]).cache_scope == "org:acme"
