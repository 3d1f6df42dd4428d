"""Which pooling a model's own files ask for, for /v1/embeddings (EngineConfig.pooling "auto").

A sentence-transformers checkpoint names it in its Pooling module (modules.json points at the folder, usually
1_Pooling/config.json, with pooling_mode_* flags); a plain config.json may carry vLLM's `pooling_type`. The
engine runs "last" (decoder embedders: Qwen3-Embedding, e5-mistral) and "mean"; a model that asks for another
(cls, max, weighted mean) is refused by name rather than served with the wrong pooling.
"""
from __future__ import annotations

import json
from pathlib import Path

SUPPORTED = ("last", "mean")
ST_MODES = {"pooling_mode_lasttoken": "last", "pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls",
            "pooling_mode_max_tokens": "max", "pooling_mode_weightedmean_tokens": "weightedmean",
            "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len"}
DEFAULT = "last"  # a model that says nothing: decoder models embed with their last token


def model_pooling(folder: str | Path) -> str | None:
    """The pooling the model's files name ("last", "mean", or another the engine does not run), or None."""
    folder = Path(folder)
    st_config = _read(folder / _pooling_module(folder) / "config.json")
    if st_config:
        modes = [mode for key, mode in ST_MODES.items() if st_config.get(key)]
        if modes:
            return modes[0] if len(modes) == 1 else "+".join(modes)
    pooling_type = (_read(folder / "config.json") or {}).get("pooling_type")
    return str(pooling_type).lower() if pooling_type else None


def resolve_pooling(setting: str, folder: str | Path) -> str:
    """setting "auto": the model's own pooling (DEFAULT when it names none); "last" or "mean" win over the model."""
    if setting != "auto":
        return setting
    found = model_pooling(folder) or DEFAULT
    if found not in SUPPORTED:
        raise ValueError(f"the model's files ask for {found!r} pooling; the engine runs {', '.join(SUPPORTED)}: "
                         f"set BATCHINFER_EMBEDDING_POOLING to one of them to embed with it anyway")
    return found


def _pooling_module(folder: Path) -> str:
    for module in _read(folder / "modules.json") or []:
        if isinstance(module, dict) and str(module.get("type", "")).endswith(".Pooling"):
            return str(module.get("path", "1_Pooling"))
    return "1_Pooling"


def _read(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
