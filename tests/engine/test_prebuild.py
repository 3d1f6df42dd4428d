"""Kernels built at install (`python -m batchinfer.engine.prebuild`, run by `make install`) into the user's cache:
a model's first load then finds every kernel it needs there and compiles nothing into the model cache."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from batchinfer.engine.attention.cpu_backend import start_attention_build
from batchinfer.engine.gguf.load import gguf_choice
from batchinfer.engine.layers.cpu_ops import start_ops_build
from batchinfer.engine.machine.native_build import cpu_supported
from batchinfer.engine.quant.kernel import load_kernel, start_packer_build
from batchinfer.engine.unsupported import UnsupportedGGUF
from batchinfer.engine.loading.loader import default_model_path

pytestmark = pytest.mark.skipif(not cpu_supported(), reason="the CPU kernels need avx2, fma and f16c")


def test_a_first_load_compiles_nothing_after_the_install_built_the_kernels(tmp_path, monkeypatch):
    user = tmp_path / "xdg"
    env = {**os.environ, "XDG_CACHE_HOME": str(user)}
    done = subprocess.run([sys.executable, "-m", "batchinfer.engine.prebuild"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    built = user / "batchinfer" / "kernels"
    assert f"C kernels ready in {built} (4 libraries" in done.stdout
    libraries = sorted(p.name.split("-")[0] for p in built.glob("*.so"))
    assert libraries == ["cpu_kernel", "cpu_ops", "qkernel", "qrepack"]

    monkeypatch.setenv("XDG_CACHE_HOME", str(user))
    models = tmp_path / "models"  # an empty model cache
    q4_k_m = frozenset({"Q4_K", "Q6_K"})  # a Q4_K_M file's types: the install's every-type libraries
    assert Path(load_kernel(str(models), q4_k_m).lib._name).parent == built
    assert start_packer_build(str(models), q4_k_m).result().parent == built
    for build in (start_attention_build, start_ops_build):
        assert build(str(models)).result().parent == built
    assert not (models / "kernels").exists()
    monkeypatch.setenv("PATH", str(tmp_path / "no-compiler"))  # a slim container: the install's kernels still serve
    monkeypatch.delenv("CC", raising=False)
    assert gguf_choice(default_model_path(), "auto", str(models))[0] == "gguf"


def test_with_no_compiler_and_no_kernel_built_auto_runs_dense_and_gguf_says_why(tmp_path, monkeypatch):
    """A machine without gcc (a slim container) whose kernels were never built: auto falls back to dense weights
    with the reason on its start-up line, instead of failing the job at the repack's build."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("PATH", str(tmp_path / "no-compiler"))
    monkeypatch.delenv("CC", raising=False)
    assert gguf_choice(default_model_path(), "auto", str(tmp_path / "models")) == (
        "dense", "auto: the integer kernel needs a C compiler (gcc) to build once")
    with pytest.raises(UnsupportedGGUF, match="needs a C compiler"):
        gguf_choice(default_model_path(), "gguf", str(tmp_path / "models"))


def test_without_the_install_a_first_load_builds_into_the_model_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    models = tmp_path / "models"
    assert start_ops_build(str(models)).result().parent == models / "kernels"
