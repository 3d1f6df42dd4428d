"""The invariance probe's row plan (pad and call size) is kept in the model cache, and read back only under the
same key: the same machine, torch, thread count, weight shapes and dtype, and probe code."""
from __future__ import annotations

import json

import pytest
import torch

from batchinfer.engine.runner import invariance, probe_cache


def _weights(dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(96, 64, generator=gen).to(dtype), torch.randn(64, 96, generator=gen).to(dtype)]


@pytest.fixture(autouse=True)
def _fresh_process_memo():
    """Each call below is a new process's start: the in-process memo is cleared around every test."""
    invariance._probed.clear()
    yield
    invariance._probed.clear()


def _stored(cache) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((cache / "invariance").glob("row-pad-*.json"))]


def test_a_warm_start_takes_the_stored_pad_instead_of_probing(tmp_path):
    plan = invariance.probe_row_pad(_weights(), 16, 3, tmp_path)
    [stored] = _stored(tmp_path)
    assert (stored["row_pad"], stored["max_rows"]) == plan and stored["invariant"] is True
    assert stored["key"]["threads"] == torch.get_num_threads()
    # Another answer under the same key proves the next start reads the file rather than probing again.
    path = next((tmp_path / "invariance").glob("row-pad-*.json"))
    path.write_text(json.dumps(stored | {"row_pad": plan.pad * 8, "max_rows": 40}))
    invariance._probed.clear()
    assert invariance.probe_row_pad(_weights(), 16, 3, tmp_path) == (plan.pad * 8, 40)


def test_other_threads_shapes_or_dtype_are_probed_on_their_own(tmp_path):
    threads = torch.get_num_threads()
    invariance.probe_row_pad(_weights(), 16, 3, tmp_path)
    invariance.probe_row_pad(_weights(torch.bfloat16), 16, 3, tmp_path)
    invariance.probe_row_pad(_weights()[:1], 16, 3, tmp_path)
    invariance.probe_row_pad(_weights(), 32, 3, tmp_path)
    torch.set_num_threads(1 if threads > 1 else 2)
    try:
        invariance.probe_row_pad(_weights(), 16, 3, tmp_path)
    finally:
        torch.set_num_threads(threads)
    assert len(_stored(tmp_path)) == 5


def test_a_torn_or_foreign_file_is_probed_again(tmp_path):
    plan = invariance.probe_row_pad(_weights(), 16, 3, tmp_path)
    path = next((tmp_path / "invariance").glob("row-pad-*.json"))
    key = json.loads(path.read_text())["key"]
    for text in ("{", json.dumps({"row_pad": 64, "max_rows": 0, "invariant": True, "key": {"machine": "another"}}),
                 json.dumps({"row_pad": 64, "invariant": True, "key": key})):  # an older file: no max_rows
        path.write_text(text)
        invariance._probed.clear()
        assert invariance.probe_row_pad(_weights(), 16, 3, tmp_path) == plan
        assert json.loads(path.read_text())["row_pad"] == plan.pad


def test_the_key_follows_the_settings_that_steer_kernel_dispatch(monkeypatch):
    shapes = [((96, 64), torch.float32, torch.device("cpu"))]
    before = probe_cache.cache_file("/c", probe_cache.probe_key(shapes, 16, 3))
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    probe_cache.machine_key.cache_clear()
    try:
        after = probe_cache.cache_file("/c", probe_cache.probe_key(shapes, 16, 3))
    finally:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
        probe_cache.machine_key.cache_clear()
    assert before != after


def test_without_a_cache_dir_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert invariance.probe_row_pad(_weights(), 16, 3).pad in invariance.ROW_PAD_CANDIDATES
    assert list(tmp_path.iterdir()) == []
