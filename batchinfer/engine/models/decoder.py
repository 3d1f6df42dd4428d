"""The decoder forward pass every family shares, over one flat ragged batch: embeddings, then per layer
RMSNorm, fused QKV (bias, q/k norms), RoPE, paged attention (window, soft-cap), gated MLP or experts.

Weights come in the engine layout (engine/loading/weights.py): mapped from its cache file, or converted from the
model here. Logits are computed only at the positions sampled. A ModelSpec (spec.py) says what differs.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..attention.base import AttentionBackend, AttentionMetadata
from ..layers.cpu_ops import TorchOps
from ..layers.linear import RowPlan, linear
from ..layers.moe import moe_mlp, quant_moe_mlp
from ..layers.rope import RopeTable
from ..lora.batch import LoRABatch
from .spec import ModelSpec

Projection = Callable[[torch.Tensor], torch.Tensor]  # a quantized projection: quant/packed.py
@dataclass
class DecoderLayer:
    input_norm: torch.Tensor
    post_norm: torch.Tensor  # before the MLP
    # dense projections; None where the model's `quant` holds them (and in an experts layer, the MLP's)
    qkv_proj: torch.Tensor | None = None  # [(num_q_heads + 2 * num_kv_heads) * head_dim, hidden]
    o_proj: torch.Tensor | None = None
    gate_up_proj: torch.Tensor | None = None  # [2 * intermediate, hidden]
    down_proj: torch.Tensor | None = None
    qkv_bias: torch.Tensor | None = None
    q_norm: torch.Tensor | None = None  # [head_dim]
    k_norm: torch.Tensor | None = None
    attn_out_norm: torch.Tensor | None = None  # sandwich norms: on the attention's and the MLP's output
    mlp_out_norm: torch.Tensor | None = None
    router: torch.Tensor | None = None  # [experts, hidden]
    # dense experts; None in an experts layer where the model's `quant` holds them (layers.{i}.experts.{e}.*)
    experts_gate_up: torch.Tensor | None = None  # [experts, 2 * intermediate, hidden]
    experts_down: torch.Tensor | None = None  # [experts, hidden, intermediate]


class DecoderForCausalLM:
    def __init__(self, spec: ModelSpec, weights: dict[str, torch.Tensor], attention: AttentionBackend,
                 device: torch.device, dtype: torch.dtype, max_model_len: int, cfg,
                 quant: dict[str, Projection] | None = None, ops: TorchOps | None = None):
        self.spec = spec
        self.num_layers, self.num_q_heads, self.num_kv_heads = spec.num_layers, spec.num_q_heads, spec.num_kv_heads
        self.head_dim, self.hidden_size, self.eps, self.scale = spec.head_dim, spec.hidden_size, spec.eps, spec.scale
        self.attention = attention
        self.row_plan = RowPlan()  # how dense matmuls cut their rows; invariance.probe_row_pad sets it
        self.quant = quant  # quantized projections for every step (quant/packed.py), or None
        self.dtype = dtype
        self.ops = ops or TorchOps(self.hidden_size, self.eps)  # norms, residual adds, activation
        self._load_weights(weights, device, dtype)
        self.ropes = {key: RopeTable.build(params, cfg, self.head_dim, max_model_len, device)
                      for key, params in spec.ropes.items()}

    def _load_weights(self, weights: dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype) -> None:
        def take(name: str):  # no copy when the dtype and device already match; an embedding in blocks as it is
            w = weights[name]
            return w.to(device=device, dtype=dtype) if isinstance(w, torch.Tensor) else w

        self.embed = take("embed")
        self.final_norm = take("final_norm")
        self.lm_head = take("lm_head") if "lm_head" in weights else self.embed
        self.layers = []
        for i in range(self.num_layers):
            prefix = f"layers.{i}."
            self.layers.append(DecoderLayer(**{name.removeprefix(prefix): take(name)
                                               for name in weights if name.startswith(prefix)}))

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]], sample_indices: torch.Tensor) -> torch.Tensor:
        """input_ids/positions: [num_tokens]; returns float32 logits [len(sample_indices), vocab]."""
        return self.forward_with_hidden(input_ids, positions, meta, kv_caches, sample_indices, sample_indices[:0])[0]

    @torch.inference_mode()
    def forward_with_hidden(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                            kv_caches: list[tuple[torch.Tensor, torch.Tensor]], sample_indices: torch.Tensor,
                            hidden_indices: torch.Tensor,
                            lora: LoRABatch | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Also the final-normed float32 hidden states of the rows hidden_indices names (embed requests); lora:
        the rows that run an adapter, and which (the base projections run once for all rows)."""
        spec = self.spec
        hidden = F.embedding(input_ids, self.embed) if isinstance(self.embed, torch.Tensor) else \
            self.embed(input_ids).to(self.dtype)
        if spec.embed_scale is not None:
            hidden = hidden * torch.tensor(spec.embed_scale, dtype=hidden.dtype)
        rope = {key: (table.cos[positions], table.sin[positions]) for key, table in self.ropes.items()}
        ops = self.ops
        x = ops.norm(hidden, self.layers[0].input_norm) if self.layers else hidden
        for i, (layer, (k_cache, v_cache)) in enumerate(zip(self.layers, kv_caches)):
            lin = _Linear(self.quant, f"layers.{i}.", self.row_plan, i, lora)
            cos, sin = rope[spec.layer_rope[i]]
            out = self._attention(layer, lin, x, cos, sin, k_cache, v_cache, meta, spec.layer_windows[i])
            x = ops.add_norm(hidden, ops.norm(out, layer.attn_out_norm), layer.post_norm)
            after = self.layers[i + 1].input_norm if i + 1 < len(self.layers) else None  # the next layer's norm
            x = ops.add_norm(hidden, ops.norm(self._mlp(layer, lin, x), layer.mlp_out_norm), after)
        rows = torch.cat([sample_indices, hidden_indices])
        normed = ops.norm(hidden[rows], self.final_norm)
        n = sample_indices.numel()
        logits = _Linear(self.quant, "", self.row_plan)(normed[:n], self.lm_head, "lm_head").float()
        if spec.final_softcap is not None:
            logits = torch.tanh(logits / spec.final_softcap) * spec.final_softcap
        return logits, normed[n:].float()

    def _attention(self, layer: DecoderLayer, lin: _Linear, x, cos, sin, k_cache, v_cache, meta,
                   window: int | None) -> torch.Tensor:
        """x: the layer's input, normed."""
        n, d, hq, hkv = x.shape[0], self.head_dim, self.num_q_heads, self.num_kv_heads
        qkv = lin(x, layer.qkv_proj, "qkv_proj")
        if layer.qkv_bias is not None:
            qkv = qkv + layer.qkv_bias
        qkv = qkv.view(n, hq + 2 * hkv, d)
        qk = qkv[:, :hq + hkv]
        if layer.q_norm is not None:
            qk = torch.cat([F.rms_norm(qk[:, :hq], (d,), layer.q_norm, self.eps),
                            F.rms_norm(qk[:, hq:], (d,), layer.k_norm, self.eps)], dim=1)
        q, k = self.attention.rope(qk, cos, sin, hq)
        v = qkv[:, hq + hkv:]
        if window is None and self.spec.attn_softcap is None:  # the Llama call, unchanged for other backends
            out = self.attention.forward(q, k, v, k_cache, v_cache, meta, self.scale)
        else:
            out = self.attention.forward(q, k, v, k_cache, v_cache, meta, self.scale, window=window,
                                         softcap=self.spec.attn_softcap)
        return lin(out.reshape(n, hq * d), layer.o_proj, "o_proj")

    def _mlp(self, layer: DecoderLayer, lin: _Linear, x) -> torch.Tensor:
        """x: the residual stream after attention, normed."""
        if layer.router is not None:
            moe = self.spec.moe
            assert moe is not None
            if layer.experts_gate_up is None:  # in GGUF blocks, among the model's quantized projections
                return quant_moe_mlp(x, layer.router, lin.experts("gate_up_proj", moe.num_experts),
                                     lin.experts("down_proj", moe.num_experts), moe.top_k, moe.renormalize,
                                     self.spec.activation, self.row_plan)
            assert layer.experts_down is not None
            return moe_mlp(x, layer.router, layer.experts_gate_up, layer.experts_down, moe.top_k, moe.renormalize,
                           self.spec.activation, self.row_plan)
        gate_up = lin(x, layer.gate_up_proj, "gate_up_proj")
        return lin(self.ops.gated(gate_up, self.spec.activation), layer.down_proj, "down_proj")


class _Linear:
    """The batch-invariant dense linear, or the quantized copy of the weight when the model has one (every step
    uses the same one: a row's result never depends on its neighbours)."""

    __slots__ = ("packs", "prefix", "rows", "layer", "lora")

    def __init__(self, packs: dict[str, Projection] | None, prefix: str, rows: RowPlan, layer: int = -1,
                 lora: LoRABatch | None = None):
        self.packs, self.prefix, self.rows, self.layer, self.lora = packs, prefix, rows, layer, lora

    def __call__(self, x: torch.Tensor, weight: torch.Tensor | None, name: str) -> torch.Tensor:
        if self.packs is None:
            assert weight is not None
            y = linear(x, weight, self.rows)
        else:
            y = self.packs[self.prefix + name](x)
        return y if self.lora is None else self.lora.add(y, x, self.layer, name)

    def experts(self, name: str, count: int) -> list[Projection]:
        """Each expert's quantized projection `name` ("gate_up_proj", "down_proj")."""
        assert self.packs is not None
        return [self.packs[f"{self.prefix}experts.{e}.{name}"] for e in range(count)]
