"""This project's engine: every request submitted at once to LLMEngine.generate (continuous batching)."""
from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..flops import ModelShape
from ..metrics import PhaseStats, RequestRecord
from ..workloads import Workload
from .base import Runner, failed_record

_run_ids = itertools.count()


@dataclass
class _Step:
    seconds: float
    flops: float
    has_prefill: bool


class EngineRunner(Runner):
    name = "engine"

    def __init__(self, options):
        from batchinfer.engine import EngineConfig, LLMEngine
        config = EngineConfig(max_num_seqs=options.max_num_seqs, max_num_batched_tokens=options.max_num_batched_tokens,
                              device=options.device, dtype=options.dtype)
        self.engine = LLMEngine.from_pretrained(options.model_path, options.cache_dir, config)
        self.shape = ModelShape.from_hf_config(_hf_config(options))

    def run(self, workload: Workload) -> tuple[list[RequestRecord], PhaseStats | None]:
        from batchinfer.engine import GenerationRequest, SamplingParams
        arrival, tag = time.time(), next(_run_ids)
        sampling = SamplingParams(max_tokens=workload.max_tokens, temperature=0.0, ignore_eos=True)
        requests = [GenerationRequest(f"{workload.name}-{tag}-{i}", p, sampling, arrival_time=arrival)
                    for i, p in enumerate(workload.prompts)]
        probe = StepProbe(self.engine, self.shape)
        try:
            with probe:
                results = self.engine.generate(requests)
        except Exception as exc:  # the whole batch failed: every request counts as a failure
            for r in requests:
                self.engine.abort(r.request_id)
            return [failed_record(r.request_id, r.prompt_token_ids, arrival, time.time(), exc) for r in requests], None
        records = [RequestRecord(r.request_id, r.prompt_tokens, r.completion_tokens, arrival, r.first_scheduled_time,
                                 r.first_token_time, r.last_token_time, r.cached_tokens, r.finish_reason)
                   for r in results]
        return records, probe.phases()


class StepProbe:
    """Times each model-runner call and counts its useful FLOPs from the scheduled batch.

    Instrumentation only: it wraps `engine.runner.run` for the duration of one run. A step is a
    prefill step when any sequence in it computes prompt tokens (decodes riding along included).
    """

    def __init__(self, engine, shape: ModelShape):
        self.engine, self.shape = engine, shape
        self.steps: list[_Step] = []
        self._original: Callable[[list], dict[str, int]] | None = None  # the runner's own run, while entered

    def __enter__(self) -> "StepProbe":
        runner = getattr(self.engine, "runner", None)
        if runner is not None and hasattr(runner, "run"):
            self._original = runner.run
            runner.run = self._timed_run
        return self

    def __exit__(self, *exc) -> None:
        if self._original is not None:
            del self.engine.runner.run

    def _timed_run(self, seqs):
        flops = sum(self._seq_flops(s) for s in seqs)
        has_prefill = any(s.num_computed_tokens < s.num_prompt_tokens or s.num_new_tokens > 1 for s in seqs)
        start = time.perf_counter()
        assert self._original is not None, "installed only while the probe is entered"
        out = self._original(seqs)
        self.steps.append(_Step(time.perf_counter() - start, flops, has_prefill))
        return out

    def _seq_flops(self, seq) -> float:
        n, c = seq.num_new_tokens, seq.num_computed_tokens
        context_sum = n * c + n * (n + 1) // 2
        head = 2 * self.shape.vocab * self.shape.hidden if seq.samples_this_step() else 0
        return 2 * self.shape.linear_params * n + self.shape.attention_flops(context_sum) + head

    def phases(self) -> PhaseStats | None:
        if not self.steps:
            return None
        pre = [s for s in self.steps if s.has_prefill]
        dec = [s for s in self.steps if not s.has_prefill]
        return PhaseStats(sum(s.seconds for s in pre), sum(s.flops for s in pre),
                          sum(s.seconds for s in dec), sum(s.flops for s in dec),
                          how=f"model-runner time of steps with prompt tokens ({len(pre)}) vs decode-only steps "
                              f"({len(dec)}); scheduling overhead excluded")


def _hf_config(options):
    from transformers import AutoConfig

    from batchinfer.engine.loading.loader import model_files_dir
    return AutoConfig.from_pretrained(model_files_dir(options.model_path, options.cache_dir))
