"""A peft adapter folder read without peft: adapter_config.json and adapter_model.safetensors, per layer and module."""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch

# base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight (peft strips the adapter's name when it saves)
KEY = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")


class AdapterError(ValueError):
    """An adapter that cannot run on this base: its one line says why."""


@dataclass(frozen=True)
class PeftAdapter:
    scaling: float  # lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora
    # (layer, module as peft names it: q_proj, gate_up_proj...) -> (A [r, in], B [out, r]) in float32
    modules: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]


def read_peft_adapter(folder: str | Path, name: str) -> PeftAdapter:
    folder = Path(folder)
    config = _read_config(folder, name)
    weights = folder / "adapter_model.safetensors"
    if not weights.is_file():
        raise AdapterError(f"adapter {name!r}: no adapter_model.safetensors in {folder}")
    from safetensors.torch import load_file  # lazy: safetensors' torch side

    return PeftAdapter(_scaling(config, name), _modules(load_file(str(weights)), name))


def _read_config(folder: Path, name: str) -> dict:
    try:
        config = json.loads((folder / "adapter_config.json").read_text())
    except (OSError, ValueError) as exc:
        raise AdapterError(f"adapter {name!r}: cannot read {folder / 'adapter_config.json'} ({exc})") from None
    unsupported = {
        "peft_type": config.get("peft_type", "LORA") != "LORA", "use_dora": bool(config.get("use_dora")),
        "bias": config.get("bias", "none") != "none", "fan_in_fan_out": bool(config.get("fan_in_fan_out")),
        "rank_pattern": bool(config.get("rank_pattern")), "alpha_pattern": bool(config.get("alpha_pattern")),
        "modules_to_save": bool(config.get("modules_to_save")),
    }
    refused = [key for key, bad in unsupported.items() if bad]
    if refused:
        raise AdapterError(f"adapter {name!r}: adapter_config.json sets {', '.join(refused)}, which the engine does not run "
                           "(plain LoRA on the attention and MLP projections only)")
    return config


def _scaling(config: dict, name: str) -> float:
    r, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(r, int) or r < 1 or not isinstance(alpha, (int, float)):
        raise AdapterError(f"adapter {name!r}: adapter_config.json needs an integer r >= 1 and a lora_alpha")
    return alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r


def _modules(tensors: dict[str, torch.Tensor], name: str) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = KEY.search(key)
        if match is None:
            raise AdapterError(f"adapter {name!r}: tensor {key} is not a LoRA weight of an attention or MLP projection")
        layer, module, half = int(match[1]), match[2], match[3]
        halves.setdefault((layer, module), {})[half] = tensor.float()
    for (layer, module), pair in halves.items():
        if set(pair) != {"A", "B"}:
            raise AdapterError(f"adapter {name!r}: layers.{layer}.{module} has lora_{''.join(pair)} only")
    return {where: (pair["A"], pair["B"]) for where, pair in halves.items()}
