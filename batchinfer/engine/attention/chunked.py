"""Batch-invariant attention in plain torch: every query reads its keys in fixed chunks of CHUNK positions
(chunk j holds positions [j * CHUNK, (j + 1) * CHUNK), whatever else is in the step), in fp32, with one
merge in a fixed order. A token's output is then the same whether its prefix was cached or computed in
the same prefill, whether it ran as a decode or in a recomputed prefill, and whatever shares its step.

How each reduction keeps one order per row:
- scores: one [rows, head_dim] x [head_dim, CHUNK] matmul per chunk, rows padded to the probed row pad
  (layers/linear.py), so every score comes out of the same GEMM kernel;
- softmax: the row's max over all its chunks (a max is exact in any order), exp, a sum over the CHUNK
  keys of each chunk (a fixed-size reduction);
- values: one [rows, CHUNK] x [CHUNK, head_dim] matmul per chunk;
- merge: a cumulative sum over the chunks, which runs in chunk order; chunks a row cannot see add exact
  zeros, so padding a batch to its longest member changes nothing.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import AttentionMetadata

CHUNK = 64  # keys per chunk
TILE = 256  # query tokens per tile of a long prefill: tiles skip the chunks after their last token
BATCHED_TILE = 64  # tiles of at most this many tokens share one padded batch


@dataclass
class ChunkBatch:
    rows: torch.Tensor  # int64 [b * t]: the flat query row of each (tile, token), padding -> 0
    tokens: int  # t: tokens per tile, padded
    valid_index: torch.Tensor  # int64 [num_valid]: where the real (tile, token) pairs sit in rows
    out_rows: torch.Tensor  # int64 [num_valid]: rows[valid_index]
    kv_rows: torch.Tensor  # int64 [b * hkv * num_chunks * CHUNK]: rows of the cache seen as [slots * hkv, d]
    bias: torch.Tensor  # float32 [b, 1, num_chunks, rows_padded, CHUNK]: 0 where a query may attend, -inf elsewhere
    num_chunks: int


@dataclass
class _Tile:
    seq: int
    start: int  # first flat query row
    tokens: int
    first_pos: int  # position of the tile's first token
    lo: int  # first chunk the tile may see
    hi: int  # one past its last chunk


def make_chunk_plan(meta: AttentionMetadata, block_size: int, window: int | None, group: int, kv_heads: int,
                    row_pad: int) -> list[ChunkBatch]:
    tiles = _tiles(meta.cu_seqlens_q.tolist(), meta.seq_lens.tolist(), window)
    decodes = [t for t in tiles if t.tokens == 1]
    short = [t for t in tiles if 1 < t.tokens <= BATCHED_TILE]
    batches = [g for g in (decodes, short) if g] + [[t] for t in tiles if t.tokens > BATCHED_TILE]
    return [_chunk_batch(meta, g, block_size, window, group, kv_heads, row_pad) for g in batches]


def _tiles(cu: list[int], seq_lens: list[int], window: int | None) -> list[_Tile]:
    tiles = []
    for seq, total in enumerate(seq_lens):
        q_len = cu[seq + 1] - cu[seq]
        for offset in range(0, q_len, TILE):
            tokens = min(TILE, q_len - offset)
            first_pos = total - q_len + offset
            lo = max(0, first_pos - window + 1) // CHUNK if window is not None else 0
            tiles.append(_Tile(seq, cu[seq] + offset, tokens, first_pos, lo, -(-(first_pos + tokens) // CHUNK)))
    return tiles


def _chunk_batch(meta: AttentionMetadata, tiles: list[_Tile], block_size: int, window: int | None, group: int,
                 kv_heads: int, row_pad: int) -> ChunkBatch:
    device = meta.block_tables.device
    lo, hi = min(t.lo for t in tiles), max(t.hi for t in tiles)
    max_t = max(t.tokens for t in tiles)
    tokens = torch.tensor([t.tokens for t in tiles], device=device)
    qpos = torch.arange(max_t, device=device)
    valid = qpos[None, :] < tokens[:, None]
    rows = torch.where(valid, torch.tensor([t.start for t in tiles], device=device)[:, None] + qpos, 0)
    query_at = torch.tensor([t.first_pos for t in tiles], device=device)[:, None] + qpos  # [b, t]
    kpos = torch.arange(lo * CHUNK, hi * CHUNK, device=device)  # absolute key positions
    tables = meta.block_tables[[t.seq for t in tiles]].long()
    block_index = (kpos // block_size).clamp(max=tables.shape[1] - 1).expand(len(tiles), -1)
    slots = torch.gather(tables, 1, block_index) * block_size + kpos % block_size
    allowed = kpos[None, None, :] <= query_at[:, :, None]
    if window is not None:
        allowed &= kpos[None, None, :] > query_at[:, :, None] - window
    allowed |= ~valid[:, :, None]  # padding rows see everything: finite, and dropped
    bias = torch.zeros(allowed.shape, dtype=torch.float32, device=device).masked_fill_(~allowed, float("-inf"))
    bias = bias.repeat(1, group, 1)  # rows (g, token) per KV head, as attend_chunks folds them
    bias = torch.nn.functional.pad(bias, (0, 0, 0, -bias.shape[1] % row_pad))
    n = hi - lo
    bias = bias.view(len(tiles), -1, n, CHUNK).transpose(1, 2).contiguous()[:, None]
    heads = torch.arange(kv_heads, device=device)
    kv_rows = (slots[:, None, :] * kv_heads + heads[None, :, None]).flatten()  # gathered as [b, hkv, keys, d]
    valid_index = valid.flatten().nonzero().flatten()
    rows = rows.flatten()
    return ChunkBatch(rows, max_t, valid_index, rows[valid_index], kv_rows, bias, n)


def chunked_attention(q: torch.Tensor, k_flat: torch.Tensor, v_flat: torch.Tensor, batch: ChunkBatch,
                      scale: float, softcap: float | None, out: torch.Tensor) -> None:
    """q [n, hq, d]; k_flat/v_flat [slots, hkv, d] (new K/V already stored); writes batch's rows of out.
    Gathers are index_select over whole rows: aten::index copies element by element, several times slower."""
    t, hq, d = batch.tokens, q.shape[1], q.shape[2]
    b = batch.rows.shape[0] // t
    hkv = k_flat.shape[1]
    group = hq // hkv
    # Fold each KV head's query-head group into the rows: K/V are never expanded to hq heads.
    queries = q.index_select(0, batch.rows).view(b, t, hq, d).permute(0, 2, 1, 3).reshape(b, hkv, group * t, d)
    shape = (b, hkv, batch.num_chunks, CHUNK, d)
    keys = k_flat.reshape(-1, d).index_select(0, batch.kv_rows).view(shape).float()
    values = v_flat.reshape(-1, d).index_select(0, batch.kv_rows).view(shape).float()
    result = attend_chunks(queries, keys, values, batch.bias, scale, softcap)
    result = result[:, :, :group * t].reshape(b, hq, t, d).transpose(1, 2).reshape(b * t, hq, d)
    out.index_copy_(0, batch.out_rows, result.index_select(0, batch.valid_index).to(out.dtype))


def attend_chunks(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor,
                  scale: float, softcap: float | None) -> torch.Tensor:
    """queries [b, h, r, d]; keys/values [b, h, n, CHUNK, d]; bias [b, 1, n, r_padded, CHUNK] -> float32
    [b, h, r_padded, d] (rows past r are padding)."""
    r_padded = bias.shape[3]
    q = torch.nn.functional.pad(queries.float(), (0, 0, 0, r_padded - queries.shape[2]))
    scores = torch.matmul(q[:, :, None], keys.transpose(-1, -2)) * scale  # [b, h, n, r, CHUNK]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores += bias
    top = scores.amax(dim=(2, 4), keepdim=True)
    probs = torch.exp(scores - top)
    total = probs.sum(-1).cumsum(2)[:, :, -1]  # [b, h, r]
    acc = torch.matmul(probs, values).cumsum(2)[:, :, -1]  # [b, h, r, d]
    return acc / total[..., None]

