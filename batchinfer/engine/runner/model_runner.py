"""Turn a scheduled batch into flat tensors, run the model over the paged KV cache, sample.

The batch is laid out decodes first (one token each), then prefill chunks; the KV cache is
allocated once, as many blocks as fit in the configured byte budget. On CPU it is an anonymous
mapping: the kernel hands out zeroed pages only as blocks are written, so a small job costs little
memory and no start-up time whatever the budget.
"""
from __future__ import annotations

import math
import mmap
from dataclasses import dataclass
from typing import Any

import torch

from ..attention.base import AttentionBackend, AttentionMetadata
from ..config import EngineConfig
from ..sampling.grammar import GrammarRunner
from .invariance import probe_linear_plan, probe_row_pad
from ..loading.checkpoint import CausalLM
from ..sampling.logits_processors import apply_logits_processors
from ..sampling.logprobs import sampled_logprobs
from ..loading.weights import engine_weights
from ..lora.adapter import BaseShapes, LoRAAdapter
from ..lora.batch import LoRABatch
from ..lora.manager import LoRAManager
from ..models import Projection, build_model
from .pooler import Pooler
from ..sampling.sampler import Sampler
from ..scheduler.sequence import Sequence


@dataclass
class BatchInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    sample_indices: torch.Tensor
    sample_seqs: list[Sequence]
    ordered: list[Sequence]  # the batch's sequences in row order
    meta_cu: list[int]  # where each one's rows start (cu_seqlens_q as a list)
    lora: LoRABatch | None = None  # the rows that run an adapter; None: every row runs the base


def kv_bytes_per_token(hf_config: Any, config: EngineConfig) -> int:
    """KV cache bytes of one token: K and V in every layer and KV head, in the engine's dtype."""
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    return 2 * hf_config.num_hidden_layers * hf_config.num_key_value_heads * head_dim * config.torch_dtype.itemsize


def kv_bytes_per_block(hf_config: Any, config: EngineConfig) -> int:
    return kv_bytes_per_token(hf_config, config) * config.block_size


class ModelRunner:
    def __init__(self, hf_model: CausalLM, config: EngineConfig, attention: AttentionBackend,
                 max_model_len: int, weights: dict[str, torch.Tensor] | None = None,
                 eos_token_ids: frozenset[int] = frozenset(), grammar: GrammarRunner | None = None,
                 quant: dict[str, Projection] | None = None):
        self.config = config
        self.eos_token_ids = eos_token_ids  # masked for a row under its min_tokens
        self.grammar = grammar  # constrained decoding, for the requests that ask
        self.device = torch.device(config.device)
        self.block_size = config.block_size
        if weights is None:  # transformers' own load: its modules converted to the engine layout here
            weights = engine_weights(hf_model, config.torch_dtype)
        self.model = build_model(hf_model, attention, self.device, config.torch_dtype, max_model_len, weights, quant,
                                 config.cache_dir)
        self._set_row_pad(attention)
        shapes = BaseShapes(self.model.spec, getattr(hf_model.config, "intermediate_size", 0))
        on_cpu = self.device.type == "cpu"  # as the base: the GPU kernels keep one order per row
        self.lora = LoRAManager(shapes, config.max_loras, self.device, probe_linear_plan if on_cpu else LoRAManager.no_probe)
        self.num_blocks = config.kv_budget_bytes() // kv_bytes_per_block(hf_model.config, config)
        if self.num_blocks < 1:
            raise ValueError(f"EngineConfig.kv_cache_bytes: budget {config.kv_budget_bytes()} B holds no KV block "
                             f"({kv_bytes_per_block(hf_model.config, config)} B each)")
        self.kv_caches = self._allocate_kv_cache()
        self.sampler = Sampler()
        self.pooler = Pooler(config.pooling)

    def _set_row_pad(self, attention: AttentionBackend) -> None:
        """Batch invariance: the matmul row pad this machine needs, probed on the model's own shapes (CPU only:
        the Triton kernels on a GPU keep one order per row by construction)."""
        if self.device.type != "cpu":
            return
        m = self.model
        weights = [] if m.quant is not None else [m.lm_head]  # quantized projections are invariant by construction
        weights += [w for layer in m.layers for w in (layer.qkv_proj, layer.o_proj, layer.gate_up_proj,
                                                      layer.down_proj, layer.router) if isinstance(w, torch.Tensor)]
        weights += [w[0] for layer in m.layers[:1] for w in (layer.experts_gate_up, layer.experts_down) if w is not None]
        m.row_plan = probe_row_pad(weights, m.head_dim, m.num_q_heads // m.num_kv_heads, self.config.cache_dir)
        if hasattr(attention, "row_pad"):
            attention.row_pad = m.row_plan.pad

    def _allocate_kv_cache(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        m = self.model
        shape = (2, m.num_layers, self.num_blocks, self.block_size, m.num_kv_heads, m.head_dim)
        cache = _zeros(shape, self.config.torch_dtype, self.device)
        return [(cache[0, i], cache[1, i]) for i in range(m.num_layers)]

    @torch.inference_mode()
    def run(self, seqs: list[Sequence]) -> dict[str, int]:
        """Run one step; returns the token sampled for each sequence that reached its end."""
        batch = self.prepare(seqs)
        chunks = self.pooler.chunks(batch.ordered, batch.meta_cu)
        logits, hidden = self.model.forward_with_hidden(batch.input_ids, batch.positions, batch.meta, self.kv_caches,
                                                        batch.sample_indices, self.pooler.rows(chunks, self.device),
                                                        batch.lora)
        self.pooler.fold(chunks, hidden)
        if not batch.sample_seqs:
            return {}
        seqs = batch.sample_seqs
        ids = [s.request_id for s in seqs]
        logits = apply_logits_processors(logits, seqs, self.eos_token_ids)
        if self.grammar is not None:
            logits = self.grammar.mask(logits, ids)
        tokens = self.sampler.sample(logits, ids, [s.sampling for s in seqs])
        if self.grammar is not None:
            self.grammar.accept(ids, tokens)
        for row, entry in sampled_logprobs(logits, seqs, tokens).items():
            seqs[row].logprobs.append(entry)
        return dict(zip(ids, tokens))

    def take_embeddings(self) -> dict[str, list[float]]:
        """The embeddings of the embed requests whose prompt the last run finished."""
        return self.pooler.take()

    # batch preparation -----------------------------------------------------------------------------

    def prepare(self, seqs: list[Sequence]) -> BatchInputs:
        decodes = [s for s in seqs if s.num_new_tokens == 1]
        prefills = [s for s in seqs if s.num_new_tokens > 1]
        ordered = decodes + prefills
        ids_d, pos_d, slots_d = self.prepare_decode(decodes)
        ids_p, pos_p, slots_p = self.prepare_prefill(prefills)
        q_lens = [s.num_new_tokens for s in ordered]
        seq_lens = [s.num_computed_tokens + s.num_new_tokens for s in ordered]
        cu = [0]
        for n in q_lens:
            cu.append(cu[-1] + n)
        meta = AttentionMetadata(
            slot_mapping=self._tensor(slots_d + slots_p, torch.int64),
            cu_seqlens_q=self._tensor(cu, torch.int32),
            seq_lens=self._tensor(seq_lens, torch.int32),
            block_tables=self._block_tables(ordered),
            max_seqlen_q=max(q_lens),
            max_seq_len=max(seq_lens),
        )
        sample_indices, sample_seqs = self.prepare_sample(ordered, cu)
        return BatchInputs(self._tensor(ids_d + ids_p, torch.int64), self._tensor(pos_d + pos_p, torch.int64),
                           meta, sample_indices, sample_seqs, ordered, cu, self.prepare_lora(ordered))

    def prepare_lora(self, seqs: list[Sequence]) -> LoRABatch | None:
        """Each row's adapter, loaded now where it is not held (the scheduler keeps a step within max_loras)."""
        in_use = {s.lora_int_id for s in seqs if s.lora_request is not None}
        rows: list[LoRAAdapter | None] = []
        for s in seqs:
            adapter = None if s.lora_request is None else self.lora.get(s.lora_request, in_use)
            rows += [adapter] * s.num_new_tokens
        return LoRABatch.of_rows(rows, self.device)

    def prepare_decode(self, seqs: list[Sequence]) -> tuple[list[int], list[int], list[int]]:
        bs = self.block_size
        positions = [s.num_computed_tokens for s in seqs]
        input_ids = [s.token_ids[p] for s, p in zip(seqs, positions)]
        slots = [s.block_table[p // bs] * bs + p % bs for s, p in zip(seqs, positions)]
        return input_ids, positions, slots

    def prepare_prefill(self, seqs: list[Sequence]) -> tuple[list[int], list[int], list[int]]:
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        for s in seqs:
            start, end = s.num_computed_tokens, s.num_computed_tokens + s.num_new_tokens
            input_ids += s.token_ids[start:end]
            positions += range(start, end)
            slots += self._chunk_slots(s.block_table, start, end)
        return input_ids, positions, slots

    def prepare_sample(self, seqs: list[Sequence], cu: list[int]) -> tuple[torch.Tensor, list[Sequence]]:
        picked = [(cu[i + 1] - 1, s) for i, s in enumerate(seqs) if s.samples_this_step() and not s.sampling.embed]
        return self._tensor([i for i, _ in picked], torch.int64), [s for _, s in picked]

    def _chunk_slots(self, block_table: list[int], start: int, end: int) -> list[int]:
        bs = self.block_size
        slots: list[int] = []
        for b in range(start // bs, (end - 1) // bs + 1):
            base = block_table[b] * bs
            slots += range(base + max(start - b * bs, 0), base + min(end - b * bs, bs))
        return slots

    def _block_tables(self, seqs: list[Sequence]) -> torch.Tensor:
        width = max(len(s.block_table) for s in seqs)
        return self._tensor([s.block_table + [0] * (width - len(s.block_table)) for s in seqs], torch.int32)

    def _tensor(self, data, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(data, dtype=dtype, device=self.device)


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    # The tensor keeps the mapping alive; untouched pages read as zero and take no memory.
    return torch.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype).view(shape)
