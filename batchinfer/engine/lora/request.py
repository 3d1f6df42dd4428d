"""LoRARequest: which adapter a request runs with (vLLM's shape). Plain data: the job layer imports it without torch."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    lora_name: str  # what people call it: the `model` a line names
    lora_int_id: int  # unique per adapter within one engine (> 0); the loaded set is keyed by it
    lora_path: str  # a peft folder: adapter_config.json + adapter_model.safetensors

    def __post_init__(self):
        if self.lora_int_id < 1:
            raise ValueError(f"LoRARequest.lora_int_id must be >= 1, got {self.lora_int_id}")
