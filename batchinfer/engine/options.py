"""The values each engine option may take, defined once: the engine's config checks against them and the app's
settings validate BATCHINFER_* against them. No torch here: settings import it on every command's start."""
from __future__ import annotations

DTYPES = ("float32", "bfloat16", "float16")  # what the engine runs; "auto" picks one (engine/machine/dtype.py)
SETTING_DTYPES = ("auto", "float32", "bfloat16")  # what BATCHINFER_DTYPE and --dtype offer
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
WEIGHT_FORMATS = ("auto", "dense", "gguf", "q8_0")  # engine/gguf/load.py, engine/quant/dense_q8_0.py
POOLINGS = ("auto", "last", "mean")  # an embed request's pooling (pooling_config.py)
ATTENTION_BACKENDS = ("auto", "torch", "triton", "cpu")
ENGINES = ("batchinfer", "hf", "null")  # which generator a process runs (runtime/engine_host.py)
DEFAULT_MAX_TOKENS = 256  # completion tokens of a request that names no limit


def one_of(values: tuple[str, ...]) -> str:
    """`'a', 'b' or 'c'`: how a message names the allowed values."""
    quoted = [repr(v) for v in values]
    return ", ".join(quoted[:-1]) + " or " + quoted[-1]
