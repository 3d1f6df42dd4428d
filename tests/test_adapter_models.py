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
