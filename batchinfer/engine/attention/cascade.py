"""Cascade (shared-prefix) attention: sequences whose block tables start with the same cached blocks
attend that prefix once, all their queries in one call, then each its own suffix; the two partial
softmaxes are merged by log-sum-exp (Hydragen; FlashInfer's cascade, vLLM's merge_attn_states).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

# A shared prefix shorter than this is attended per sequence: an extra call and a merge cost more
# than re-reading a few blocks.
MIN_SHARED_BLOCKS = 4


@dataclass
class SharedPrefixGroup:
    members: list[int]  # indices into the block tables passed to find_shared_prefixes
    num_blocks: int  # leading blocks every member has, fully cached before its first new token


def find_shared_prefixes(tables: list[list[int]], cached_blocks: list[int],
                         min_blocks: int = MIN_SHARED_BLOCKS) -> list[SharedPrefixGroup]:
    """Groups of two or more sequences whose first num_blocks block ids are equal, each sequence in at
    most one group. cached_blocks[i]: how many leading blocks of sequence i hold only cached tokens (every
    new query sees all of them, so the prefix needs no mask). A group whose common prefix is shorter than
    min_blocks is split by the next block id, so a short common system prompt does not hide longer
    documents shared below it."""
    groups: list[SharedPrefixGroup] = []
    _split([i for i, n in enumerate(cached_blocks) if n >= min_blocks], 0, tables, cached_blocks, min_blocks, groups)
    return groups


def _split(members: list[int], depth: int, tables, cached_blocks, min_blocks: int, out: list) -> None:
    by_block: dict[int, list[int]] = {}
    for i in members:
        if cached_blocks[i] > depth:
            by_block.setdefault(tables[i][depth], []).append(i)
    for group in by_block.values():
        if len(group) < 2:
            continue
        common = _common_blocks(group, depth, tables, cached_blocks)
        if common >= min_blocks:
            out.append(SharedPrefixGroup(group, common))
        else:
            _split(group, common, tables, cached_blocks, min_blocks, out)


def _common_blocks(group: list[int], depth: int, tables, cached_blocks) -> int:
    """Length of the block-id prefix all of group share (they agree on the first depth + 1 already)."""
    limit = min(cached_blocks[i] for i in group)
    first = tables[group[0]]
    n = depth + 1
    while n < limit and all(tables[i][n] == first[n] for i in group):
        n += 1
    return n


def merge_attention_states(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
                           lse_b: torch.Tensor) -> torch.Tensor:
    """Softmax attention over keys A and B together, from each part's output [n, h, d] and natural-log
    log-sum-exp of its scores [n, h] (float32)."""
    top = torch.maximum(lse_a, lse_b)
    w_a, w_b = torch.exp(lse_a - top), torch.exp(lse_b - top)
    total = w_a + w_b
    merged = out_a.float() * (w_a / total)[..., None] + out_b.float() * (w_b / total)[..., None]
    return merged.to(out_a.dtype)


def attention_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
                       scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Grouped-query attention that also returns the log-sum-exp of the scaled scores.

    q [b, hq, lq, d], k/v [b, hkv, lk, d], bias broadcastable to [b, 1, lq, lk] (or None) ->
    out [b, hq, lq, d], lse [b, hq, lq] float32. The query-head group of each KV head is folded into the
    query length, so K/V are never expanded to hq heads."""
    b, hq, lq, d = q.shape
    hkv = k.shape[1]
    group = hq // hkv
    folded = q.reshape(b, hkv, group * lq, d)  # query head h = kv * group + g: rows (g, query) per KV head
    if bias is not None and group > 1:
        bias = bias.expand(b, 1, lq, bias.shape[-1]).repeat(1, 1, group, 1)
    if q.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(folded, k, v, 0.0, False,
                                                                              attn_mask=bias, scale=scale)
    else:
        out, lse = _attention_with_lse_math(folded, k, v, bias, scale)
    return out.reshape(b, hq, lq, d), lse.reshape(b, hq, lq)


def _attention_with_lse_math(q, k, v, bias, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    if bias is not None:
        scores = scores + bias.float()
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.matmul(torch.exp(scores - lse[..., None]), v.float())
    return out.to(q.dtype), lse
