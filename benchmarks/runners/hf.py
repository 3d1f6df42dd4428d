"""transformers generate(): one request at a time, or left-padded batches."""
from __future__ import annotations

import time
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from batchinfer.engine.loading.loader import load_model
from ..flops import ModelShape
from ..metrics import PhaseStats, RequestRecord
from ..workloads import Workload
from .base import Runner, failed_record

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class StepClock(LogitsProcessor):
    """Called once per generated token, just before it is picked: the token's time."""

    def __init__(self):
        self.times: list[float] = []

    def __call__(self, input_ids, scores):
        self.times.append(time.time())
        return scores


class HFRunner(Runner):
    def __init__(self, options, batch_size: int, name: str):
        self.name, self.batch_size = name, batch_size
        loaded = load_model(options.model_path, options.cache_dir, dtype=_DTYPES[options.dtype])
        self.device = torch.device(options.device)
        # load_model's transformers model: .to, .generate and generation_config, which CausalLM does not promise.
        model: Any = loaded.hf_model
        self.model = model.to(self.device)
        # generate() falls back to the model's own eos_token_id when given None; clear it so EOS is
        # sampled like any token and every request runs to max_tokens, as on the other systems.
        self.model.generation_config.eos_token_id = None
        self.pad_id = loaded.tokenizer.pad_token_id if loaded.tokenizer.pad_token_id is not None else 0
        self.shape = ModelShape.from_hf_config(loaded.config)

    def run(self, workload: Workload) -> tuple[list[RequestRecord], PhaseStats]:
        arrival, records = time.time(), []
        prefill_s = decode_s = 0.0
        for lo in range(0, len(workload.prompts), self.batch_size):
            batch = workload.prompts[lo:lo + self.batch_size]
            ids = [f"{workload.name}-{lo + i}" for i in range(len(batch))]
            start = time.time()
            try:
                times = self._generate(batch, workload.max_tokens)
            except Exception as exc:  # counted as failures, the run goes on
                records += [failed_record(i, p, arrival, time.time(), exc) for i, p in zip(ids, batch)]
                continue
            prefill_s += times[0] - start
            decode_s += times[-1] - times[0]
            records += [RequestRecord(i, len(p), len(times), arrival, start, times[0], times[-1])
                        for i, p in zip(ids, batch)]
        ok = [r for r in records if r.error is None]
        phases = PhaseStats(
            prefill_s, sum(self.shape.prefill_flops(r.prompt_tokens) for r in ok),
            decode_s, sum(self.shape.decode_flops(r.prompt_tokens, r.output_tokens) for r in ok),
            how=f"per batch of {self.batch_size}: start to first token, first to last token; padding not counted")
        return records, phases

    def _generate(self, batch: list[list[int]], max_tokens: int) -> list[float]:
        width = max(len(p) for p in batch)
        input_ids = torch.tensor([[self.pad_id] * (width - len(p)) + p for p in batch], device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=self.device)
        config = GenerationConfig(max_new_tokens=max_tokens, do_sample=False, eos_token_id=None,
                                  pad_token_id=self.pad_id)
        clock = StepClock()
        with torch.inference_mode():
            out = self.model.generate(input_ids, attention_mask=mask, generation_config=config,
                                      logits_processor=LogitsProcessorList([clock]))
        if out.shape[1] - width != len(clock.times):
            raise RuntimeError(f"generated {out.shape[1] - width} tokens but timed {len(clock.times)}")
        return clock.times
