"""LLMEngine: requests in, results out; each step schedules a batch, runs it, folds the tokens back."""
from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import replace
from pathlib import Path

from .attention import make_attention_backend
from .kvcache.block_copy import copy_blocks
from .kvcache.block_manager import BlockManager
from .config import EngineConfig
from .sampling.grammar import GrammarRunner
from .sampling.grammar_deadline import compile_error
from .loading.loader import LoadedModel, load_model_light
from .machine.heap import keep_freed_memory
from .runner.model_runner import ModelRunner
from .scheduler.parallel_sampling import ParentRequest, PromptSequence, sample_requests
from .runner.pooling_config import resolve_pooling
from .scheduler.scheduler import Scheduler
from .scheduler.sequence import Sequence
from .scheduler.step_stats import StepStats
from .sampling.stop_checker import StopChecker
from .types import EngineDescription, GenerationRequest, GenerationResult, context_length, now, refusal


class LLMEngine:
    def __init__(self, loaded: LoadedModel, config: EngineConfig | None = None):
        self.config = config or EngineConfig()
        self.config = replace(self.config, pooling=resolve_pooling(self.config.pooling, loaded.path))
        self.config = loaded_weight_format(self.config, loaded)
        if self.config.device == "cpu":
            keep_freed_memory()
        self.tokenizer = loaded.tokenizer
        hf_config = loaded.hf_model.config
        self.max_model_len: int = context_length(hf_config, self.config.max_model_len)
        attention = make_attention_backend(self.config.attention_backend, self.config.device, self.config.cache_dir,
                                           self.config.torch_dtype)
        eos = eos_token_ids(loaded)
        self.stop_checker = StopChecker(self.tokenizer, eos, self.max_model_len, self.config.detokenize)
        self.grammar = GrammarRunner(self.tokenizer, hf_config.vocab_size, frozenset(eos), self.stop_checker.token_bytes)
        self.runner = ModelRunner(loaded.hf_model, self.config, attention, self.max_model_len, loaded.weights,
                                  frozenset(eos), self.grammar, loaded.quant)
        self.block_manager = BlockManager(self.runner.num_blocks, self.config.block_size,
                                          self.config.enable_prefix_caching, self.config.pooling == "last")
        self.scheduler = Scheduler(self.config, self.block_manager)
        self.seqs: dict[str, Sequence] = {}
        self.parents: dict[str, ParentRequest] = {}  # n > 1 requests by id
        self.parent_of: dict[str, str] = {}  # sample sequence id -> its request's id
        self.step_stats = StepStats()

    @property
    def description(self) -> EngineDescription:
        return self.config.description

    @property
    def dtype_note(self) -> str:
        return self.config.dtype_note

    @property
    def weights_note(self) -> str:
        return self.config.weights_note

    @classmethod
    def from_pretrained(cls, model_path: str | None, cache_dir: str | Path,
                        config: EngineConfig | None = None) -> LLMEngine:
        config = config or EngineConfig()
        if config.cache_dir is None:  # the model cache also keeps what the engine measures of this machine
            config = replace(config, cache_dir=str(cache_dir))
        if config.device == "cpu" and config.attention_backend in ("auto", "cpu"):
            from .attention.cpu_backend import start_attention_build  # lazy: a CPU engine's only
            from .layers.cpu_ops import start_ops_build

            start_attention_build(config.cache_dir)  # gcc beside the model's load where it must build
            start_ops_build(config.cache_dir)
        return cls(load_model_light(model_path, cache_dir, config.torch_dtype, config.weight_format), config)

    # the request API -------------------------------------------------------------------------------

    def add_request(self, req: GenerationRequest) -> None:
        if req.request_id in self.seqs or req.request_id in self.parents:
            raise ValueError(f"duplicate request_id {req.request_id!r}")
        self.check_request(req)
        if req.lora_request is not None:  # loaded now: an adapter that does not fit the base refuses its request
            self.runner.lora.get(req.lora_request, self._adapters_running())
        if req.sampling.n > 1:
            self._add_parent(req)
            return
        self.add_grammar(req)
        self.scheduler.add(self._sequence(req))

    def step(self) -> list[GenerationResult]:
        started = time.perf_counter()  # the whole step, scheduling and detokenizing too: what a run takes
        seqs = self.scheduler.schedule()
        if not seqs:
            return []
        self._mark_scheduled(seqs)
        prompt, pairs = self.step_stats.prompt_tokens(seqs), self.step_stats.pairs(seqs)
        copy_blocks(self.runner.kv_caches, self.block_manager.take_copies())  # copy on write, before any write
        sampled = self.runner.run(seqs)
        embedded = self.runner.take_embeddings()
        finished = self.scheduler.postprocess(seqs, sampled, self.stop_checker)
        finished += self._finish_embedded(seqs, embedded)
        self._mark_tokens(seqs, sampled.keys() | embedded.keys())
        self._fork_prefilled(seqs)
        results = self._merge_samples([self._result(s) for s in finished])
        self.step_stats.record(seqs, time.perf_counter() - started, prompt, pairs)
        return results

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def abort(self, request_id: str) -> GenerationResult | None:
        """Stop a waiting or running request now and free its KV blocks (vLLM's abort_request); its result
        (finish_reason "abort", the tokens generated so far), or None for an id the engine does not hold."""
        parent = self.parents.pop(request_id, None)
        if parent is not None:
            return self._abort_parent(parent)
        seq = self.seqs.pop(request_id, None)
        if seq is None or seq.is_finished:
            return None
        self.scheduler.finish(seq, "abort")
        self.runner.sampler.remove(request_id)
        self.grammar.remove(request_id)
        return aborted_result(seq, self.stop_checker)

    def generate(self, requests: Iterable[GenerationRequest],
                 on_result: Callable[[GenerationResult], None] | None = None,
                 aborts: Callable[[], Collection[str]] | None = None) -> list[GenerationResult]:
        """Run all requests to completion; on_result sees each as it finishes, the list keeps input order.

        A request the engine cannot run (empty, over the context, a bad seed, a duplicate id) gets an
        error result of its own (GenerationResult.error); the rest of the batch runs. aborts(), asked
        before every step, names requests to stop now: they end with finish_reason "abort"."""
        order: list[str] = []
        refused: dict[int, GenerationResult] = {}  # by position: a duplicate id must not hide its error
        for req in requests:
            try:
                self.add_request(req)
            except ValueError as exc:
                refused[len(order)] = GenerationResult.failed(req, str(exc))
                if on_result is not None:
                    on_result(refused[len(order)])
            order.append(req.request_id)
        results: dict[str, GenerationResult] = {}
        while self.has_unfinished():
            stopped = [self.abort(rid) for rid in (aborts() if aborts is not None else ())]
            for result in [r for r in stopped if r is not None] + self.step():
                results[result.request_id] = result
                if on_result is not None:
                    on_result(result)
        return [refused.get(i) or results[rid] for i, rid in enumerate(order)]

    @property
    def num_preemptions(self) -> int:
        return self.scheduler.num_preemptions

    def stats(self) -> dict[str, int]:
        """KV cache and scheduler counters since the engine started."""
        bm = self.block_manager
        return {"num_blocks": bm.num_blocks, "free_blocks": len(bm.free_block_ids),
                "cached_blocks": len(bm.cached_block_ids), "evictions": bm.num_evictions,
                "preemptions": self.scheduler.num_preemptions, "waiting": len(self.scheduler.waiting),
                "running": len(self.scheduler.running), "forked_blocks": bm.num_forked_blocks,
                "cow_copies": bm.num_cow_copies}

    # bookkeeping -----------------------------------------------------------------------------------

    def check_request(self, req: GenerationRequest) -> None:
        """Raise ValueError if the request can never run here (empty, too long for the context or the KV cache)."""
        total = len(req.prompt_token_ids) + req.sampling.max_tokens
        problem = refusal(req, self.max_model_len)
        if problem:
            raise ValueError(problem)
        if self.block_manager.blocks_for(min(total, self.max_model_len)) > self.block_manager.num_blocks:
            raise ValueError(f"request {req.request_id}: {total} tokens exceed the whole KV cache "
                             f"({self.block_manager.num_blocks} blocks of {self.config.block_size})")

    def _adapters_running(self) -> set[int]:
        return {s.lora_int_id for s in self.scheduler.running if s.lora_request is not None}

    def add_grammar(self, req: GenerationRequest) -> None:
        """The request's matcher (its grammar compiled on first sight); a grammar that fails refuses the request."""
        try:
            self.grammar.add(req.request_id, req.sampling.guided)
        except Exception as exc:  # xgrammar raises RuntimeError/ValueError with its parser's message
            raise ValueError(f"request {req.request_id}: its output format cannot be compiled "
                             f"({compile_error(exc)})") from None

    def _sequence(self, req: GenerationRequest) -> Sequence:
        seq = Sequence(req.request_id, req.prompt_token_ids, req.sampling,
                       req.arrival_time if req.arrival_time is not None else now(), req.cache_salt, req.lora_request)
        self.seqs[seq.request_id] = seq
        self.runner.sampler.add(seq.request_id, seq.sampling, self.config.device)
        return seq

    # n > 1: one prompt, n samples (parallel_sampling.py) ----------------------------------------------

    def _add_parent(self, req: GenerationRequest) -> None:
        """Every sample's sequence, seed and grammar now; the prompt but its last token is computed once,
        by a PromptSequence, before the samples fork it (a one-token prompt has nothing to share)."""
        if req.arrival_time is None:
            req.arrival_time = now()
        children = sample_requests(req)
        for child in children:
            self.add_grammar(child)  # compiled once: the first raises for all, before anything is held
        samples = [self._sequence(child) for child in children]
        prompt = None
        if len(req.prompt_token_ids) > 1:
            prompt = PromptSequence(f"{req.request_id}#prompt", req.prompt_token_ids[:-1], children[0].sampling,
                                    req.arrival_time, req.cache_salt, req.lora_request, num_samples=len(children),
                                    parent_id=req.request_id)
        self.parents[req.request_id] = ParentRequest(req, samples, prompt)
        self.parent_of.update((s.request_id, req.request_id) for s in samples)
        for seq in [prompt] if prompt is not None else samples:
            self.scheduler.add(seq)

    def _fork_prefilled(self, seqs: list[Sequence]) -> None:
        for prompt in seqs:
            if isinstance(prompt, PromptSequence) and prompt.prefilled and not prompt.is_finished:
                samples = self.parents[prompt.parent_id].samples
                for sample in samples:
                    self.block_manager.fork(prompt, sample)
                    sample.num_cached_tokens = prompt.num_cached_tokens
                    sample.first_scheduled_time = prompt.first_scheduled_time
                self.scheduler.fork(prompt, samples)

    def _merge_samples(self, results: list[GenerationResult]) -> list[GenerationResult]:
        """A sample's result waits for its siblings': the request's result holds them all."""
        out = []
        for result in results:
            parent_id = self.parent_of.pop(result.request_id, None)
            if parent_id is None:
                out.append(result)
                continue
            parent = self.parents[parent_id]
            parent.results[result.request_id] = result
            if parent.done:
                del self.parents[parent_id]
                out.append(parent.result())
        return out

    def _abort_parent(self, parent: ParentRequest) -> GenerationResult:
        if parent.prompt is not None and not parent.prompt.is_finished:
            self.scheduler.finish(parent.prompt, "abort")
        for seq in parent.samples:
            if seq.request_id in parent.results:
                continue
            self.parent_of.pop(seq.request_id, None)
            self.seqs.pop(seq.request_id, None)
            self.scheduler.finish(seq, "abort")
            self.runner.sampler.remove(seq.request_id)
            self.grammar.remove(seq.request_id)
            parent.results[seq.request_id] = aborted_result(seq, self.stop_checker)
        return parent.result()

    # bookkeeping, continued ---------------------------------------------------------------------------

    def _mark_scheduled(self, seqs: list[Sequence]) -> None:
        t = now()
        for seq in seqs:
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = t

    def _finish_embedded(self, seqs: list[Sequence], embedded: dict[str, list[float]]) -> list[Sequence]:
        """An embed request ends with its prefill: no token is sampled."""
        done = [s for s in seqs if s.request_id in embedded]
        for seq in done:
            seq.embedding = embedded[seq.request_id]
            self.scheduler.finish(seq, "stop")
        return done

    def _mark_tokens(self, seqs: list[Sequence], sampled: Collection[str]) -> None:
        t = now()
        for seq in seqs:
            if seq.request_id in sampled:
                if seq.first_token_time is None:
                    seq.first_token_time = t
                seq.last_token_time = t

    def _result(self, seq: Sequence) -> GenerationResult:
        self.seqs.pop(seq.request_id, None)
        self.runner.sampler.remove(seq.request_id)
        self.grammar.remove(seq.request_id)
        return sequence_result(seq, self.stop_checker)


def sequence_result(seq: Sequence, stop_checker: StopChecker) -> GenerationResult:
    """What a finished sequence reports (the transformers reference path reports the same way)."""
    # Finished means scheduled and sampled at least once: the reason and every time are set.
    assert seq.finish_reason is not None and seq.first_scheduled_time is not None
    assert seq.first_token_time is not None and seq.last_token_time is not None
    text = stop_checker.final_text(seq)
    return GenerationResult(
        request_id=seq.request_id,
        output_token_ids=seq.output_token_ids,
        text=text or "",
        finish_reason=seq.finish_reason,
        prompt_tokens=seq.num_prompt_tokens,
        cached_tokens=seq.num_cached_tokens or 0,
        arrival_time=seq.arrival_time,
        first_scheduled_time=seq.first_scheduled_time,
        first_token_time=seq.first_token_time,
        last_token_time=seq.last_token_time,
        embedding=seq.embedding,
        logprobs=[stop_checker.with_bytes(e) for e in seq.logprobs] if seq.sampling.logprobs is not None else None,
        stop_reason=seq.stop_reason,
        text_pending=text is None,
    )


def aborted_result(seq: Sequence, stop_checker: StopChecker) -> GenerationResult:
    """What an aborted sequence reports: the tokens it had; a sequence never scheduled has its arrival as every time."""
    t = seq.arrival_time
    first = seq.first_scheduled_time or t
    text = stop_checker.final_text(seq)
    return GenerationResult(
        request_id=seq.request_id, output_token_ids=seq.output_token_ids, text=text or "",
        finish_reason="abort", prompt_tokens=seq.num_prompt_tokens, cached_tokens=seq.num_cached_tokens or 0,
        arrival_time=t, first_scheduled_time=first, first_token_time=seq.first_token_time or first,
        last_token_time=seq.last_token_time or first, text_pending=text is None)


def loaded_weight_format(config: EngineConfig, loaded: LoadedModel) -> EngineConfig:
    """The config with the weight format the loaded model holds: auto takes the loader's choice and reason;
    an explicit format must be what was loaded (load_model_light(..., weight_format) loads it)."""
    if config.weight_format == "auto":
        return replace(config, weight_format=loaded.weight_format, weight_format_reason=loaded.weight_format_reason)
    if config.weight_format != loaded.weight_format:
        raise ValueError(f"EngineConfig.weight_format is {config.weight_format!r}, but the loaded model holds "
                         f"{loaded.weight_format!r} weights (load it with that weight_format)")
    return config


def eos_token_ids(loaded: LoadedModel) -> set[int]:
    """Every id that ends a sequence: the model config's, the generation config's and the tokenizer's."""
    ids: set[int] = set()
    for source in (loaded.hf_model.config, getattr(loaded.hf_model, "generation_config", None)):
        eos = getattr(source, "eos_token_id", None)
        ids.update(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
    if loaded.tokenizer.eos_token_id is not None:
        ids.add(loaded.tokenizer.eos_token_id)
    return ids
