"""What the engine reads of a loaded model and its tokenizer, whoever loaded them (no torch: validation imports
Tokenizer alone)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class Tokenizer(Protocol):
    """What the engine and validation use of a tokenizer: light_loader.LightTokenizer or a transformers one."""
    @property
    def eos_token_id(self) -> int | None: ...

    @property
    def pad_token_id(self) -> int | None: ...

    def encode(self, text: str, /, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: list[int], /, skip_special_tokens: bool = ...) -> str: ...

    def apply_chat_template(self, messages: list[dict[str, Any]], /, add_generation_prompt: bool = ...,
                            tokenize: bool = ...) -> Any: ...


class CausalLM(Protocol):
    """What the engine reads of a model: a transformers PreTrainedModel or light_loader's attribute tree.
    The config is the model's config.json as attributes (PretrainedConfig or a SimpleNamespace)."""
    config: Any
    model: Any
    lm_head: Any


@dataclass
class LoadedModel:
    hf_model: CausalLM
    tokenizer: Tokenizer
    path: str
    weights: dict[str, Any] | None = None  # the engine layout (engine/loading/weights.py), when already made
    quant: dict[str, Any] | None = None  # quantized projections (quant/packed.py), when asked
    weight_format: str = "dense"  # what `weights`/`quant` hold: "dense", "gguf" or "q8_0"
    weight_format_reason: str = "asked"  # why (gguf/load.gguf_choice), printed at start-up

    @property
    def config(self) -> Any:
        return self.hf_model.config
