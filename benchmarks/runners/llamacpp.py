"""llama.cpp through llama-cpp-python on the same GGUF file, one request at a time (file order or sorted), greedy."""
from __future__ import annotations

import time

from batchinfer.engine.loading.loader import default_model_path, model_files_dir
from ..flops import ModelShape
from ..metrics import PhaseStats, RequestRecord
from ..workloads import Workload, common_prefix_len
from .base import Runner, SystemUnavailable, failed_record, sequential_phases


def model_shape(gguf: str, cache_dir: str) -> ModelShape:
    from transformers import AutoConfig
    return ModelShape.from_hf_config(AutoConfig.from_pretrained(model_files_dir(gguf, cache_dir)))


class LlamaCppRunner(Runner):
    """One request at a time; sort_prompts serves them sorted, so neighbours share the longest prefix."""

    def __init__(self, options, sort_prompts: bool = False):
        self.name = "llamacpp-sorted" if sort_prompts else "llamacpp"
        self.sort_prompts = sort_prompts
        try:
            from llama_cpp import Llama
        except ImportError as exc:
            raise SystemUnavailable(f"llama-cpp-python is not installed (pip install 'batchinfer[llamacpp]'): {exc}") from exc
        gguf = options.model_path or default_model_path()
        if not gguf.endswith(".gguf"):
            raise SystemUnavailable(f"llama.cpp needs a .gguf file, got {gguf}")
        self.shape = model_shape(gguf, options.cache_dir)
        self.gguf = gguf
        self.llm = Llama(model_path=gguf, n_ctx=4096, n_batch=512, n_threads=options.llamacpp_threads,
                         n_threads_batch=options.llamacpp_threads, seed=options.seed, verbose=False)

    def run(self, workload: Workload) -> tuple[list[RequestRecord], PhaseStats]:
        arrival, records = time.time(), []
        order = list(enumerate(workload.prompts))
        if self.sort_prompts:
            order.sort(key=lambda item: item[1])
        for i, prompt in order:
            rid, start = f"{workload.name}-{i}", time.time()
            try:
                records.append(self._one(rid, prompt, workload.max_tokens, arrival, start))
            except Exception as exc:  # counted as failures, the run goes on
                records.append(failed_record(rid, prompt, arrival, time.time(), exc))
        return records, sequential_phases(records, self.shape, "per request: start to first token, first to last")

    def _one(self, rid: str, prompt: list[int], max_tokens: int, arrival: float, start: float) -> RequestRecord:
        # llama-cpp-python keeps the previous request's KV and re-evaluates only past the common prefix
        # (it always recomputes the last prompt token); that reuse is this system's prefix cache.
        reused = common_prefix_len(list(self.llm._input_ids[:self.llm.n_tokens]), prompt[:-1])
        times = []
        for _ in self.llm.generate(prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
            times.append(time.time())
            if len(times) == max_tokens:
                break
        return RequestRecord(rid, len(prompt), len(times), arrival, start, times[0], times[-1], cached_tokens=reused)

