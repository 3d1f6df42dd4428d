"""Start-up probe for batch invariance: how matmul rows are cut into calls (the row pad, and the most rows a
call) so that every row is independent of its batch.

GEMM libraries choose kernels by the shape they are given, and the choice is the machine's (CPU flags,
library version, thread count), so the plan is measured here, on the model's own weight shapes and dtype,
rather than assumed: the smallest pad, then the largest call, under which every probed row count gives each
row bitwise the result it has in the largest call, and under which the chunked attention gives a query the
same output whatever else shares its batch. The answer is kept in the model cache (probe_cache.py), keyed on what
decides it, so a warm start on the same machine and torch does not probe again.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import torch

from . import probe_cache
from ..attention.chunked import CHUNK, attend_chunks
from ..layers.linear import RowPlan, linear, pad_rows

log = logging.getLogger(__name__)

ROW_PAD_CANDIDATES = (1, 4, 8, 16, 32)
MAX_ROWS_CANDIDATES = (0, 128, 64, 48, 32, 16)  # 0: any number of rows in one call
PROBE_ROWS = (1, 2, 3, 5, 6, 7, 9, 13, 17, 33, 49, 65, 129, 257)  # around multiples of 4 and 8, and larger calls
REFERENCE_ROWS = 300  # the call every probed one is compared with (rows past max_rows are cut into calls)
# cuBLAS changes fp32 kernels at larger row counts than oneDNN (seen on an H200: dtype.py); a GPU probes them too
CUDA_PROBE_ROWS = PROBE_ROWS + (64, 128, 300)
CUDA_REFERENCE_ROWS = 512
# Each row count is checked on this many outputs of the reference call at least (calls side by side): a kernel
# whose sums differ from the reference's in the last fp32 bits shows it in one bf16 output in thousands
COVERED_OUTPUTS = 1 << 15
_probed: dict[tuple, RowPlan] = {}  # one probe per process for each set of shapes


def probe_row_pad(weights: list[torch.Tensor], head_dim: int, group: int,
                  cache_dir: str | Path | None = None) -> RowPlan:
    """The smallest row pad, and with it the largest call, under which every weight shape (one of each) and the
    attention are invariant; read from cache_dir when this machine, torch and these shapes were probed before."""
    shapes = _one_per_shape(weights)
    key = (tuple(shapes), head_dim, group, torch.get_num_threads(), cache_dir)
    if key not in _probed:
        _probed[key] = _cached_probe(list(shapes.values()), head_dim, group, cache_dir)
    return _probed[key]


def _cached_probe(weights: list[torch.Tensor], head_dim: int, group: int, cache_dir: str | Path | None) -> RowPlan:
    if cache_dir is None:
        return _probe(weights, head_dim, group)[0]
    key = probe_cache.probe_key([(tuple(w.shape), w.dtype, w.device) for w in weights], head_dim, group)
    path = probe_cache.cache_file(cache_dir, key)
    stored = probe_cache.load(path, key)
    if stored is not None:
        if not stored.get("invariant"):
            _warn_not_invariant()
        return RowPlan(stored["row_pad"], stored["max_rows"])
    plan, invariant = _probe(weights, head_dim, group)
    probe_cache.save(path, key, plan, invariant)
    return plan


def _probe(weights: list[torch.Tensor], head_dim: int, group: int) -> tuple[RowPlan, bool]:
    return _first_invariant(weights, lambda pad: _attention_invariant(head_dim, group, pad))


def probe_linear_plan(weights: list[torch.Tensor]) -> RowPlan:
    """The smallest row pad, and with it the largest call, under which these weights' matmuls alone are invariant
    (a LoRA adapter's A and B, probed at load: a small rank picks other kernels than the base's shapes)."""
    shapes = _one_per_shape(weights)
    key = ("linear", tuple(shapes), torch.get_num_threads())
    if key not in _probed:
        _probed[key] = _first_invariant(list(shapes.values()), lambda pad: True)[0]
    return _probed[key]


def _one_per_shape(weights: list[torch.Tensor]) -> dict[tuple, torch.Tensor]:
    shapes: dict[tuple, torch.Tensor] = {}
    for w in weights:
        shapes.setdefault((tuple(w.shape), w.dtype, w.device), w)
    return shapes


def _first_invariant(weights: list[torch.Tensor], pad_ok: Callable[[int], bool]) -> tuple[RowPlan, bool]:
    """(plan, whether it is invariant): the smallest pad pad_ok allows, then the largest call, under which every
    weight's matmul is; the largest pad in calls of its size, with a warning, when none is."""
    for pad in ROW_PAD_CANDIDATES:
        if not pad_ok(pad):
            continue
        for most in (m for m in MAX_ROWS_CANDIDATES if m % pad == 0):
            if all(_linear_invariant(w, RowPlan(pad, most)) for w in weights):
                return RowPlan(pad, most), True
    _warn_not_invariant()
    return RowPlan(ROW_PAD_CANDIDATES[-1], ROW_PAD_CANDIDATES[-1]), False


def _warn_not_invariant() -> None:
    log.warning("no row pad in %s and call size in %s made the matmuls batch-invariant on this machine; outputs may "
                "depend on the batch", ROW_PAD_CANDIDATES, MAX_ROWS_CANDIDATES)


def _randn(*shape: int, dtype: torch.dtype, device, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)


def _wide(*shape: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Normal values scaled by 2^-8..2^8: sums that cancel round apart in more outputs when two kernels sum in
    other orders (a bf16 GEMM's one-row path on an AVX512-BF16 Xeon: 44 outputs in 174,528 differ from its
    many-row path, 26 on normal values)."""
    gen = torch.Generator().manual_seed(4)
    scale = torch.exp2(torch.randint(-8, 9, shape, generator=gen).float())
    return (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=dtype)


def _linear_invariant(weight: torch.Tensor, plan: RowPlan) -> bool:
    cuda = weight.device.type == "cuda"
    x = _wide((CUDA_REFERENCE_ROWS if cuda else REFERENCE_ROWS) + 3, weight.shape[1], dtype=weight.dtype,
              device=weight.device)
    want = linear(x, weight, plan)
    for rows in CUDA_PROBE_ROWS if cuda else PROBE_ROWS:
        first = rows % 4  # a row's place in the call must not matter either
        calls = min(-(-COVERED_OUTPUTS // (rows * weight.shape[0])), (len(x) - first) // rows)
        for start in range(first, first + rows * calls, rows):
            if not torch.equal(linear(x[start:start + rows], weight, plan), want[start:start + rows]):
                return False
    return True


def _attention_invariant(head_dim: int, group: int, pad: int) -> bool:
    """Three sequences' queries in one padded batch against each alone, with its own (shorter) chunk count."""
    batch, kv_heads, chunks = 3, 2, 3
    lens = (CHUNK * chunks, CHUNK + 5, 7)  # keys each sequence sees
    rows = (5 * group, 2 * group, group)  # each one's real query rows
    q = _randn(batch, kv_heads, max(rows), head_dim, dtype=torch.float32, device="cpu", seed=1)
    k = _randn(batch, kv_heads, chunks, CHUNK, head_dim, dtype=torch.float32, device="cpu", seed=2)
    v = _randn(batch, kv_heads, chunks, CHUNK, head_dim, dtype=torch.float32, device="cpu", seed=3)
    together = attend_chunks(q, k, v, _bias(lens, max(rows), chunks, pad), 0.125, None)
    for i, (n, r) in enumerate(zip(lens, rows)):
        own = -(-n // CHUNK)
        alone = attend_chunks(q[i:i + 1, :, :r], k[i:i + 1, :, :own], v[i:i + 1, :, :own],
                              _bias(lens[i:i + 1], r, own, pad), 0.125, None)
        if not torch.equal(alone[0, :, :r], together[i, :, :r]):
            return False
    return True


def _bias(lens: tuple[int, ...], rows: int, chunks: int, pad: int) -> torch.Tensor:
    keys = torch.arange(chunks * CHUNK)
    allowed = (keys[None, :] < torch.tensor(lens)[:, None])[:, None, :].expand(-1, rows, -1)
    bias = torch.zeros(allowed.shape).masked_fill_(~allowed, float("-inf"))
    bias = torch.stack([pad_rows(b, pad) for b in bias])
    return bias.view(len(lens), -1, chunks, CHUNK).transpose(1, 2).contiguous()[:, None]
