"""A GGUF file loaded for the engine in its own blocks: nothing de-quantized to float but the rows a step embeds.

First load (an empty cache): the kernel compiles in the background while the metadata becomes config.json and
the tokenizer files (transformers' GGUF tokenizer converter), then the projections are repacked into one cache
file (gguf/packed_file.py). Later loads read the small files and map the packed one. Norms are copied (small);
the embedding rows are de-quantized as each step looks them up, straight from the mapped GGUF.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from ..quant.kernel import Kernel, load_kernel, load_packer, start_build, start_packer_build
from ..quant.packed import StackedWeight, dequantize_rows
from ..quant.packed_file import Source, drop, packed_weights, quantize_q8_0, write_packed
from ..unsupported import UnsupportedGGUF
from .config import hf_config
from .reader import GGUFFile, open_gguf
from .tensors import FLOATS, Part, dense_tensors, projections
from .files import cache_folder, write_small_files

log = logging.getLogger(__name__)


@dataclass
class QuantEmbedding:
    """token_embd in its GGUF blocks: the looked-up rows de-quantized (exactly as gguf's dequantize) per step."""
    raw: np.ndarray
    qtype: str
    vocab: int
    dim: int
    kernel: Kernel

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        return dequantize_rows(self.kernel, self.qtype, self.raw, self.vocab, self.dim, ids)


@dataclass
class GGUFModel:
    tree: SimpleNamespace  # config and generation_config, as the engine reads a checkpoint
    folder: Path  # config.json, the tokenizer files and the packed weights
    weights: dict[str, object]  # norms (tensors) and the embedding
    quant: dict[str, StackedWeight]  # every projection and the LM head
    kinds: str  # the block types and the kernel's path, for the start-up line


def gguf_choice(path: str | Path, weight_format: str, cache_dir: str) -> tuple[str, str]:
    """("gguf" or "dense", why) for weight_format "auto" or "gguf". A file the kernel cannot read (an unknown
    architecture or block type) raises UnsupportedGGUF, one line naming the tensor; so does "gguf" on a CPU
    without the kernel's instructions, or with neither its library built nor a C compiler to build it."""
    from ..quant.kernel import CPU_FLAGS, available, supported  # lazy: only when a GGUF is chosen

    if not supported():
        if weight_format == "gguf":
            raise UnsupportedGGUF(f"weight_format gguf needs a CPU with {', '.join(CPU_FLAGS)}")
        return "dense", f"auto: the integer kernel needs {'/'.join(CPU_FLAGS)}"
    g = open_gguf(path)
    plan = projections(g, hf_config(g))
    types = {g.tensors[part.tensor].type for p in plan for part in p.parts}
    if weight_format == "auto" and types <= set(FLOATS):
        return "dense", f"auto: the GGUF's projections are {'/'.join(sorted(types))}, not quantized blocks"
    if not available(cache_dir, frozenset("Q8_0" if t in FLOATS else t for t in types)):
        if weight_format == "gguf":
            raise UnsupportedGGUF("weight_format gguf needs a C compiler (gcc) to build the integer kernel once")
        return "dense", "auto: the integer kernel needs a C compiler (gcc) to build once"
    return "gguf", "asked" if weight_format == "gguf" else "auto: the GGUF's own blocks, integer dot products"


def load_gguf(path: str | Path, cache_dir: str | Path) -> GGUFModel:
    started, path = time.time(), Path(path)
    g = open_gguf(path)
    config = hf_config(g)
    plan = projections(g, config)
    sources = gguf_sources(g, [part for p in plan for part in p.parts])
    types = frozenset(s.qtype for s in sources)
    start_build(str(cache_dir), types)  # gcc runs while the small files are written and the weights repacked
    folder = cache_folder(path, cache_dir)
    first = not (folder / "weights.packed").exists()
    if first:
        start_packer_build(str(cache_dir), types)  # the repack alone: 0.4 s of gcc, not the kernel's 3-4 s
    beside = folder.parent / f".{folder.name}.packed-{os.getpid()}"
    try:
        if first:  # repacked while the kernel's GEMMs compile, beside the folder: a first run's CLI may still be
            # writing the small files (the tokenizer's conversion, 1-3 s), and this need not wait for them
            write_packed(sources, load_packer(str(cache_dir), types), beside)
        if not (folder / "config.json").exists():
            write_small_files(g, config, folder)
        if first:
            os.replace(beside, folder / "weights.packed")
    finally:
        beside.unlink(missing_ok=True)
    kernel = load_kernel(str(cache_dir), types)
    packed = packed_weights(sources, kernel, folder / "weights.packed")
    quant = {p.name: StackedWeight([packed[part.key] for part in p.parts]) for p in plan}
    weights: dict[str, object] = {name: _float(g, parts) for name, parts in dense_tensors(g, config).items()}
    weights["embed"] = _embedding(g, kernel)
    kinds = "/".join(sorted({w.qtype for s in quant.values() for w in s.parts})) + f" on {kernel.name}"
    log.info("loaded %s in its own blocks (%s) in %.1f s", path.name, kinds, time.time() - started)
    tree = SimpleNamespace(config=SimpleNamespace(**config), generation_config=SimpleNamespace())
    return GGUFModel(tree, folder, weights, quant, kinds)


def gguf_sources(g: GGUFFile, parts: list[Part]) -> list[Source]:
    out = {}
    for part in parts:  # a tied head appears once
        out[part.key] = _source(g, part)
    return list(out.values())


def _source(g: GGUFFile, part: Part) -> Source:
    """One matrix: a 2-D tensor, or one expert's rows of a 3-D one (the experts lie one after another)."""
    info = g.tensors[part.tensor]
    n, k = info.shape[-2:]
    count = info.shape[0] if len(info.shape) == 3 else 1
    size = info.nbytes // count
    offset = info.offset + (part.expert or 0) * size
    float_type = info.type in FLOATS
    blocks = partial(_q8_0, g, part) if float_type else partial(_bytes, g, offset, size)
    return Source(part.key, "Q8_0" if float_type else info.type, n, k, blocks, part.rows(n),
                  partial(drop, g._map, offset, size))


def _bytes(g: GGUFFile, offset: int, size: int) -> np.ndarray:
    return g.bytes[offset:offset + size]


def _q8_0(g: GGUFFile, part: Part) -> np.ndarray:
    return quantize_q8_0(g.array(part.tensor, part.expert))


def _float(g: GGUFFile, parts: tuple[Part, ...]) -> torch.Tensor:
    """Float tensors (norms, biases, a router) concatenated, rows in the checkpoint's order."""
    arrays = []
    for part in parts:
        a, rows = g.array(part.tensor), part.rows(g.tensors[part.tensor].shape[0])
        arrays.append(a if rows is None else a[rows])
    return torch.from_numpy(np.concatenate(arrays).copy())


def _embedding(g: GGUFFile, kernel: Kernel) -> object:
    info = g.tensors["token_embd.weight"]
    if info.type in FLOATS:
        return torch.from_numpy(g.array("token_embd.weight").copy())
    return QuantEmbedding(g.raw("token_embd.weight"), info.type, info.shape[0], info.shape[1], kernel)
