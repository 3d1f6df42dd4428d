"""Reading a checkpoint's layers into the engine layout (fused QKV and gate/up), from a transformers model or
light_loader's attribute tree: both name modules as the checkpoint does (model.layers[i].self_attn.q_proj)."""
from __future__ import annotations

import torch


def attention_weights(attn, norm_offset: float = 0.0) -> dict[str, torch.Tensor]:
    """qkv_proj (q, k, v stacked), o_proj, and where the checkpoint has them the q/k/v bias and q/k norms."""
    if hasattr(attn, "qkv_proj"):  # already fused (Phi-3)
        out = {"qkv_proj": attn.qkv_proj.weight}
    else:
        out = {"qkv_proj": torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])}
        if getattr(attn.q_proj, "bias", None) is not None:
            out["qkv_bias"] = torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias])
    if hasattr(attn, "q_norm"):
        out |= {"q_norm": norm(attn.q_norm.weight, norm_offset), "k_norm": norm(attn.k_norm.weight, norm_offset)}
    return out | {"o_proj": attn.o_proj.weight}


def mlp_weights(mlp) -> dict[str, torch.Tensor]:
    if hasattr(mlp, "gate_up_proj"):  # already fused (Phi-3), gate first
        return {"gate_up_proj": mlp.gate_up_proj.weight, "down_proj": mlp.down_proj.weight}
    return {"gate_up_proj": torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]), "down_proj": mlp.down_proj.weight}


def expert_weights(mlp, num_experts: int) -> dict[str, torch.Tensor]:
    """router [E, hidden], experts_gate_up [E, 2 * inter, hidden], experts_down [E, hidden, inter]: from
    transformers 5's fused experts, or the per-expert tensors checkpoints ship."""
    router = mlp.gate.weight
    experts = mlp.experts
    if isinstance(getattr(experts, "gate_up_proj", None), torch.Tensor):
        return {"router": router, "experts_gate_up": experts.gate_up_proj, "experts_down": experts.down_proj}
    each = [_item(experts, e) for e in range(num_experts)]
    return {"router": router,
            "experts_gate_up": torch.stack([torch.cat([x.gate_proj.weight, x.up_proj.weight]) for x in each]),
            "experts_down": torch.stack([x.down_proj.weight for x in each])}


def norm(weight: torch.Tensor, offset: float) -> torch.Tensor:
    """Gemma stores RMSNorm weights as w and multiplies by (1 + w): the engine keeps 1 + w (added in fp32)."""
    return weight.float() + offset if offset else weight


def _item(container, index: int):
    return container[index] if hasattr(container, "__getitem__") else getattr(container, str(index))
