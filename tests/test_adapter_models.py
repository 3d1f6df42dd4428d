"""Adapters as models, without weights: BATCHINFER_ADAPTERS checked on creation, an adapter's batch is its base's,
and GET /v1/models lists each adapter with its base (`parent`, `root`) as vLLM does."""
from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from batchinfer.settings import Settings

pytestmark = pytest.mark.fast


def test_adapters_are_read_from_json_and_numbered_for_the_engine(monkeypatch):
    monkeypatch.setenv("BATCHINFER_ADAPTERS", json.dumps({"b-tuned": "/adapters/b", "a-tuned": "/adapters/a"}))
    monkeypatch.setenv("BATCHINFER_MAX_LOADED_ADAPTERS", "3")
    settings = Settings()
    found = settings.lora_requests()
    assert [(r.lora_name, r.lora_int_id, r.lora_path) for r in found.values()] == [
        ("a-tuned", 1, "/adapters/a"), ("b-tuned", 2, "/adapters/b")]
    assert settings.max_loaded_adapters == 3 and settings.adapter_base("a-tuned") == settings.model_id


@pytest.mark.parametrize("adapters, models, why", [
    ({"bad id!": "/x"}, {}, "BATCHINFER_ADAPTERS"),
    ({"tuned": ""}, {}, "has no folder"),
    ({"tuned": "s3:///adapters/tuned"}, {}, "names no bucket"),
    ({"other": "/x"}, {"other": "/ckpt"}, "already a model's id"),
])
def test_a_bad_adapter_setting_fails_naming_it(adapters, models, why):
    with pytest.raises(ValidationError, match=why):
        Settings(adapters=adapters, models=models)


def test_another_model_of_the_fleet_has_none_of_the_base_adapters():
    settings = Settings(adapters={"tuned": "/x"}, models={"other": "/ckpt"})
    assert settings.for_model("other").adapters == {}


def test_models_lists_each_adapter_with_its_base(make_context):
    from batchinfer.api.app import model_list

    ctx = make_context(adapters={"tuned-b": "/x", "tuned-a": "/y"})
    listed = {m["id"]: m for m in model_list(ctx)}
    base = ctx.settings.model_id
    assert listed["tuned-a"]["parent"] == listed["tuned-b"]["root"] == base
    assert "parent" not in listed[base] and listed["tuned-a"]["object"] == "model"
    assert [m["id"] for m in model_list(ctx)][-2:] == ["tuned-a", "tuned-b"]


def test_prefix_groups_show_each_group_s_adapter_and_none_for_the_base(make_context):
    """The batch status view (GET /v1/batches/{id}/prefix_groups, and `batchinfer status`'s table) names the adapter
    of each group: the lines of two adapters and of the base share a prompt, yet form three groups."""
    from rich.console import Console

    from batchinfer.api.batches import prefix_groups
    from batchinfer.cli.render import groups_table_of
    from batchinfer.jobs import service
    from batchinfer.jobs.dispatch.planning import dispatch
    from batchinfer.jobs.units.runner import run_unit
    from batchinfer.planner import PlannerConfig
    from batchinfer.runtime.null_generator import NullGenerator
    from jobfiles import completion_line, submit_lines

    ctx = make_context(adapters={"tuned-a": "/x", "tuned-b": "/y"})
    shared = "Answer in one word, as a careful assistant who reads the whole question first. " * 4
    base = ctx.settings.model_id
    job = submit_lines(ctx, [completion_line(f"{m}-{i}", shared + f"Item {i}?", model=m)
                             for m in ("tuned-a", base, "tuned-b") for i in range(3)])
    generator = NullGenerator.from_settings(ctx.settings)
    for unit in dispatch(ctx, [], PlannerConfig(max_requests_per_unit=3)):
        assert run_unit(ctx, unit.unit_id, generator, "w1").completed == 3
    shown = prefix_groups(job.id, ctx, service.ANY_OWNER)["data"]
    by_adapter = {g["adapter"]: (g["requests"], g["done"], g["shared_prefix_len"] > 0) for g in shown}
    assert by_adapter == {None: (3, 3, True), "tuned-a": (3, 3, True), "tuned-b": (3, 3, True)}  # None: the base
    table = Console(width=160, record=True)
    table.print(groups_table_of(shown))
    text = table.export_text()
    assert "adapter" in text and "tuned-a" in text and "tuned-b" in text
