"""Random peft LoRA adapters of the tiny checkpoints (tests/engine/tiny_families.py), written by peft itself.

init_lora_weights=False makes A and B both random, so every adapted projection changes the model's answers.
"""
from __future__ import annotations

from pathlib import Path

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
ALL_LINEAR = ATTENTION + ["gate_proj", "up_proj", "down_proj"]


def build_adapter(base: Path, folder: Path, r: int, targets: list[str], seed: int, alpha: int = 16,
                  rslora: bool = False) -> Path:
    """Write a peft adapter of `base` into folder: adapter_config.json + adapter_model.safetensors."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    torch.manual_seed(seed)
    config = LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, init_lora_weights=False, use_rslora=rslora,
                        lora_dropout=0.0)
    get_peft_model(model, config).save_pretrained(folder)
    return folder


def peft_model(base: Path, adapter: Path):
    """transformers + peft: the base with the adapter applied, as peft runs it (eager attention, float32)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, attn_implementation="eager")
    return PeftModel.from_pretrained(model, adapter).eval()
