"""LoRA adapters in S3 (BATCHINFER_ADAPTERS values s3://bucket/prefix) against the suite's real S3 server: fetched
once into the worker's cache, read by the engine from there; a file too big or missing refuses the adapter's lines
in one line while the unit's other lines run."""
from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from batchinfer.engine.lora.peft_files import read_peft_adapter
from batchinfer.engine.lora.request import LoRARequest
from batchinfer.jobs.units.adapter_files import AdapterFetchError, fetch_adapter, local_adapters
from batchinfer.storage import open_storage

RANK = 4


def peft_folder(folder: Path) -> Path:
    """A rank-4 adapter of one projection, as peft saves it."""
    folder.mkdir(parents=True)
    key = "base_model.model.model.layers.0.self_attn.q_proj"
    save_file({f"{key}.lora_A.weight": torch.randn(RANK, 32), f"{key}.lora_B.weight": torch.randn(32, RANK)},
              str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": RANK, "lora_alpha": 8,
                                                            "target_modules": ["q_proj"]}))
    return folder


def upload(s3_bucket: str, folder: Path, *names: str) -> str:
    url = f"s3://{s3_bucket}/adapters-{uuid.uuid4().hex[:8]}/tuned"
    storage = open_storage(url)
    for name in names or ("adapter_config.json", "adapter_model.safetensors"):
        with (folder / name).open("rb") as source:
            storage.upload(name, source)
    return url


def test_an_adapter_in_s3_is_fetched_once_and_read_from_the_cache(s3_bucket, tmp_path):
    url = upload(s3_bucket, peft_folder(tmp_path / "made"))
    local = fetch_adapter("tuned", url, tmp_path / "cache", max_bytes=1 << 20)
    assert local.parent == tmp_path / "cache" / "adapters"
    assert read_peft_adapter(local, "tuned").scaling == 2.0  # lora_alpha / r: the engine reads the copy
    assert (local / "adapter_model.safetensors").read_bytes() == (tmp_path / "made/adapter_model.safetensors").read_bytes()
    open_storage(url).delete("adapter_model.safetensors")  # gone from S3: the cache's copy serves
    assert fetch_adapter("tuned", url, tmp_path / "cache", max_bytes=1 << 20) == local
    assert [p.name for p in (tmp_path / "cache" / "adapters").iterdir()] == [local.name]  # no staging left


def test_a_file_over_the_limit_or_missing_is_refused_in_one_line_and_nothing_is_cached(s3_bucket, tmp_path):
    made = peft_folder(tmp_path / "made")
    url = upload(s3_bucket, made)
    size = (made / "adapter_model.safetensors").stat().st_size
    with pytest.raises(AdapterFetchError) as big:
        fetch_adapter("tuned", url, tmp_path / "cache", max_bytes=size - 1)
    assert str(big.value) == (f"adapter 'tuned': {url}/adapter_model.safetensors is {size} bytes, over "
                              f"BATCHINFER_MAX_ADAPTER_BYTES ({size - 1})")
    half = upload(s3_bucket, made, "adapter_config.json")
    with pytest.raises(AdapterFetchError, match=r"^adapter 'tuned': no adapter_model.safetensors at s3://") as missing:
        fetch_adapter("tuned", half, tmp_path / "cache", max_bytes=1 << 20)
    assert "\n" not in str(missing.value)
    assert list((tmp_path / "cache" / "adapters").iterdir()) == []


def test_only_the_named_adapters_in_s3_are_fetched_and_local_ones_are_left_as_they_are(s3_bucket, tmp_path):
    url = upload(s3_bucket, peft_folder(tmp_path / "made"))
    adapters = {"remote": LoRARequest("remote", 1, url), "local": LoRARequest("local", 2, "/adapters/local"),
                "broken": LoRARequest("broken", 3, url + "-nothing-here"), "unused": LoRARequest("unused", 4, url + "-x")}
    found, refused = local_adapters(adapters, ["local", "remote", "broken", "remote"], tmp_path / "cache", 1 << 20)
    assert Path(found["remote"].lora_path).parent == tmp_path / "cache" / "adapters"
    assert found["local"] == adapters["local"] and found["unused"] == adapters["unused"]
    assert list(refused) == ["broken"] and refused["broken"].startswith("adapter 'broken': no adapter_config.json at")


def test_a_unit_fails_the_lines_of_an_adapter_it_cannot_fetch_and_runs_the_rest(make_context, s3_bucket, tmp_path):
    from batchinfer.jobs.dispatch.planning import dispatch
    from batchinfer.jobs.units.runner import run_unit
    from batchinfer.runtime.null_generator import NullGenerator
    from jobfiles import completion_line, read_output, submit_lines

    made = peft_folder(tmp_path / "made")
    url = upload(s3_bucket, made)
    ctx = make_context(adapters={"tuned": url, "huge": upload(s3_bucket, made)}, model_cache=tmp_path / "models",
                       max_adapter_bytes=(made / "adapter_model.safetensors").stat().st_size)
    big = open_storage(ctx.settings.adapters["huge"])
    with big.open_write("adapter_model.safetensors") as out:  # one byte over the limit
        out.write((made / "adapter_model.safetensors").read_bytes() + b"\0")
    models = ["tuned", "huge", ctx.settings.model_id]
    job = submit_lines(ctx, [completion_line(f"c{i}", f"Item {i}:", model=m) for i, m in enumerate(models)])
    (unit,) = dispatch(ctx)
    outcome = run_unit(ctx, unit.unit_id, NullGenerator.from_settings(ctx.settings), "w1")
    assert (outcome.completed, outcome.failed) == (2, 1)
    (error,) = read_output(ctx, job.id, errors=True)
    size = (made / "adapter_model.safetensors").stat().st_size
    assert error["custom_id"] == "c1" and error["error"] == {
        "code": "invalid_request", "line": 2, "param": None,
        "message": f"adapter 'huge': {ctx.settings.adapters['huge']}/adapter_model.safetensors is {size + 1} bytes, "
                   f"over BATCHINFER_MAX_ADAPTER_BYTES ({size})"}
    assert [o["custom_id"] for o in read_output(ctx, job.id)] == ["c0", "c2"]
    assert [p.name for p in (tmp_path / "models" / "adapters").iterdir()] == [Path(
        fetch_adapter("tuned", url, tmp_path / "models", 1 << 20)).name]
