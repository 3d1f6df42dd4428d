"""A GGUF's small files (config.json, the tokenizer's) are written by one process at a time: on a first run the CLI
and its engine process both ask for them, and the second waits for the first's instead of converting the tokenizer
again beside it."""
from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import pytest

from batchinfer.engine.gguf import files
from batchinfer.engine.loading.loader import default_model_path

pytestmark = pytest.mark.fast


def _ask(cache: str, log: str) -> None:
    real = files.write_tokenizer

    def counted(g, folder):  # instrumentation, not a stand-in: the real conversion runs
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(0.5)  # hold the conversion open long enough for the other process to ask
        real(g, folder)

    files.write_tokenizer = counted
    folder = files.small_files(default_model_path(), cache)
    assert (folder / "tokenizer.json").exists() and (folder / "config.json").exists()


def test_two_processes_asking_at_once_convert_the_tokenizer_once(tmp_path):
    log = tmp_path / "conversions.log"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_ask, args=(str(tmp_path / "cache"), str(log))) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    assert len(log.read_text().split()) == 1
    folder = files.cache_folder(Path(default_model_path()), tmp_path / "cache")
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "tokenizer.json", "tokenizer_config.json"]
