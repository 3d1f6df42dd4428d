"""Pooling from the model's own files: sentence-transformers' Pooling module, a config.json pooling_type, or last."""
from __future__ import annotations

import json

import pytest

from batchinfer.engine.runner.pooling_config import model_pooling, resolve_pooling

pytestmark = pytest.mark.fast


def _st_model(folder, modes: dict, module_path: str = "1_Pooling", with_modules: bool = True):
    (folder / module_path).mkdir(parents=True)
    (folder / module_path / "config.json").write_text(json.dumps({"word_embedding_dimension": 8, **modes}))
    if with_modules:
        (folder / "modules.json").write_text(json.dumps([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": module_path, "type": "sentence_transformers.models.Pooling"}]))


def test_a_sentence_transformers_pooling_module_names_the_pooling(tmp_path):
    _st_model(tmp_path / "mean", {"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False})
    _st_model(tmp_path / "last", {"pooling_mode_lasttoken": True}, module_path="2_Pool")
    _st_model(tmp_path / "bare", {"pooling_mode_mean_tokens": True}, with_modules=False)
    assert [model_pooling(tmp_path / n) for n in ("mean", "last", "bare")] == ["mean", "last", "mean"]
    assert resolve_pooling("auto", tmp_path / "last") == "last" and resolve_pooling("auto", tmp_path / "mean") == "mean"


def test_config_pooling_type_then_the_default_then_the_setting_wins(tmp_path):
    (tmp_path / "typed").mkdir()
    (tmp_path / "typed" / "config.json").write_text(json.dumps({"model_type": "qwen3", "pooling_type": "MEAN"}))
    assert resolve_pooling("auto", tmp_path / "typed") == "mean"
    assert resolve_pooling("auto", tmp_path / "nothing-here") == "last"  # a decoder model that says nothing
    assert resolve_pooling("last", tmp_path / "typed") == "last"  # an explicit setting wins over the model


def test_a_pooling_the_engine_does_not_run_is_refused_by_name(tmp_path):
    _st_model(tmp_path / "cls", {"pooling_mode_cls_token": True})
    with pytest.raises(ValueError, match="'cls' pooling"):
        resolve_pooling("auto", tmp_path / "cls")
    assert resolve_pooling("mean", tmp_path / "cls") == "mean"
