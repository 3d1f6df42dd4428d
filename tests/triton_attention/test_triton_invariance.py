"""The extend kernel gives a token bitwise the same output however its sequence reaches it: a fresh prefill
beside other sequences, an extend over a cached prefix of any length, a recompute, a decode step alone or
in a batch of decodes (issue 20: the Triton path keeps the CPU path's guarantee). Every sequence's K/V are
stored once; each arrangement is a different choice of which tokens are new in the step."""
import pytest
import torch

from batchinfer.engine.kernels.extend_attention import extend_attention

LENS = [70, 33, 129, 5]


def _step(q_all, starts, k_cache, v_cache, tables, picks, **kw):
    """One step: picks is [(sequence, first new position, seq_len)]: the new tokens are first..seq_len-1.
    Returns each pick's output rows [seq_len - first, heads, dim]."""
    rows = torch.cat([q_all[starts[s] + first: starts[s] + end] for s, first, end in picks])
    q_lens = [end - first for _, first, end in picks]
    cu = torch.tensor([0] + q_lens, device=q_all.device).cumsum(0).to(torch.int32)
    seq_lens = torch.tensor([end for _, _, end in picks], dtype=torch.int32, device=q_all.device)
    out = extend_attention(rows, k_cache, v_cache, cu, seq_lens, tables[[s for s, _, _ in picks]], max(q_lens),
                           q_all.shape[-1] ** -0.5, **kw)
    return [out[cu[i]:cu[i + 1]] for i in range(len(picks))]


@pytest.mark.parametrize("window,softcap,tiles", [
    (None, None, {}), (None, None, dict(block_m=16, block_n=16)), (24, 5.0, dict(block_m=16, block_n=16)),
])
def test_triton_extend_is_bitwise_the_same_for_a_token_in_any_arrangement(paged_batch, window, softcap, tiles):
    batch = paged_batch([0] * len(LENS), LENS, 16, kv_heads=2, group=3, head_dim=32, dtype=torch.float32, seed=7)
    k_cache, v_cache = batch.stored_caches()
    starts = batch.meta.cu_seqlens_q.tolist()
    tables = batch.meta.block_tables
    kw = dict(window=window, softcap=softcap, **tiles)
    step = lambda picks: _step(batch.q, starts, k_cache, v_cache, tables, picks, **kw)  # noqa: E731

    prefill = step([(s, 0, n) for s, n in enumerate(LENS)])  # every sequence fresh, one step
    target = 2  # the longest: several tiles and (with the window) keys out of sight
    reference = prefill[target]
    checks = {
        "prefill alone": step([(target, 0, LENS[target])])[0],
        "extend over 16 cached": step([(target, 16, LENS[target])])[0],
        "extend over 50 cached beside another": step([(0, 0, LENS[0]), (target, 50, LENS[target])])[1],
    }
    for name, rows in checks.items():
        assert torch.equal(rows, reference[-len(rows):]), name
    for pos in (0, 63, 64, 100, LENS[target] - 1):  # each as a decode step alone and among other decodes
        alone = step([(target, pos, pos + 1)])[0]
        among = step([(1, LENS[1] - 1, LENS[1]), (target, pos, pos + 1), (3, 2, 3)])[1]
        assert torch.equal(alone[0], reference[pos]), f"decode alone at {pos}"
        assert torch.equal(among[0], reference[pos]), f"decode among others at {pos}"
