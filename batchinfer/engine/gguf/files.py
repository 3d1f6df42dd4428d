"""The small files a GGUF's cache folder holds beside its packed weights: config.json and the tokenizer's, written
from the file's metadata alone. Torch-free: validation and planning (the CLI, the API) read only these."""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from pathlib import Path

from ..loading.file_key import file_key
from .config import hf_config
from .reader import GGUFFile
from .tokenizer import write_tokenizer

LAYOUT_VERSION = 3  # 2: every family's config (rope_parameters, head_dim), experts packed one by one; 3: packed
# K-quant scales (quant/packed_file.py VERSION 2)


def cache_folder(path: Path, cache_dir: str | Path) -> Path:
    return Path(cache_dir) / "engine" / f"{path.stem}-{file_key(path, LAYOUT_VERSION)}-gguf"


def small_files(path: str | Path, cache_dir: str | Path) -> Path:
    """The folder with config.json and the tokenizer's files of a GGUF, written from its metadata if missing."""
    folder = cache_folder(Path(path), cache_dir)
    if not (folder / "config.json").exists():
        g = GGUFFile(path)
        write_small_files(g, hf_config(g), folder)
    return folder


def write_small_files(g: GGUFFile, config: dict, folder: Path) -> None:
    """config.json and the tokenizer's files, written beside and renamed into place, by one process at a time: on a
    first run the CLI (validation) and its engine process both need them, and each converting the tokenizer
    (transformers' import, ~2.7 CPU s) beside the other and gcc cost the run seconds."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when closed
        if not (folder / "config.json").exists():  # else the other process wrote them while this one waited
            _write(g, config, folder)


def _write(g: GGUFFile, config: dict, folder: Path) -> None:
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
    try:
        (tmp / "config.json").write_text(json.dumps(config, indent=1))
        write_tokenizer(g, tmp)
        try:
            os.replace(tmp, folder)
        except OSError:
            if not (folder / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
