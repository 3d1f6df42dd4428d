"""llama.cpp driven for throughput, as its `batched` and `parallel` examples do, through the low-level API.

Prompts are served in waves of up to `parallel` sequences (sorted, so a wave shares its document). A wave's
common prefix is evaluated once on sequence 0 and copied to the others with llama_memory_seq_cp; then every
sequence's own suffix goes in one llama_batch with many sequence ids, and decode runs one token per live
sequence per llama_decode. Greedy (argmax of the logits).
"""
from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass, field

from batchinfer.engine.loading.loader import default_model_path
from ..metrics import PhaseStats, RequestRecord
from ..workloads import Workload, common_prefix_len
from .base import Runner, SystemUnavailable, failed_record


@dataclass
class SeqResult:
    index: int  # position in the input list
    start: float
    cached_tokens: int
    tokens: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)


def load_binding():
    """The llama_cpp module and numpy, or ImportError with the reason."""
    import llama_cpp
    import numpy
    return llama_cpp, numpy


class MultiSequenceLlama:
    def __init__(self, gguf: str, threads: int, n_ctx: int = 8192, n_batch: int = 2048, parallel: int = 32):
        self.lib, self.np = load_binding()
        lib = self.lib
        lib.llama_backend_init()
        self.parallel, self.n_batch = parallel, n_batch
        self.model = lib.llama_model_load_from_file(gguf.encode(), lib.llama_model_default_params())
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {gguf}")
        params = lib.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch = n_ctx, n_batch, min(512, n_batch)
        params.n_seq_max, params.kv_unified = parallel, True  # one KV buffer: copied prefixes share cells
        params.n_threads = params.n_threads_batch = threads
        self.ctx = lib.llama_init_from_model(self.model, params)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create a context")
        self.n_ctx = n_ctx
        self.vocab = lib.llama_model_get_vocab(self.model)
        self.n_vocab = lib.llama_vocab_n_tokens(self.vocab)
        self.memory = lib.llama_get_memory(self.ctx)
        self.batch = lib.llama_batch_init(n_batch, 0, parallel)

    def close(self) -> None:
        lib = self.lib
        lib.llama_batch_free(self.batch)
        lib.llama_free(self.ctx)
        lib.llama_model_free(self.model)

    def generate(self, prompts: list[list[int]], max_tokens: int, stop_at_eos: bool = False) -> list[SeqResult]:
        order = sorted(range(len(prompts)), key=lambda i: prompts[i])
        results: dict[int, SeqResult] = {}
        for w in range(0, len(order), self.parallel):
            wave = order[w:w + self.parallel]
            for r in self._wave([prompts[i] for i in wave], max_tokens, stop_at_eos):
                r.index = wave[r.index]
                results[r.index] = r
        return [results[i] for i in range(len(prompts))]

    def _wave(self, prompts: list[list[int]], max_tokens: int, stop_at_eos: bool) -> list[SeqResult]:
        lib = self.lib
        lib.llama_memory_clear(self.memory, True)
        # Keep at least the last prompt token per sequence: its logits give the first output token.
        shared = min(min(common_prefix_len(prompts[0], p) for p in prompts), min(len(p) for p in prompts) - 1)
        needed = shared + sum(len(p) - shared + max_tokens for p in prompts)
        if needed > self.n_ctx:
            raise RuntimeError(f"wave needs {needed} KV cells, context has {self.n_ctx}")
        start = time.time()
        seqs = [SeqResult(i, start, shared if i else 0) for i in range(len(prompts))]
        self._eval([(t, pos, [0], False) for pos, t in enumerate(prompts[0][:shared])])
        for j in range(1, len(prompts)):
            lib.llama_memory_seq_cp(self.memory, 0, j, -1, -1)
        items = [(t, pos, [j], pos == len(p) - 1) for j, p in enumerate(prompts)
                 for pos, t in enumerate(p[shared:], start=shared)]
        logits_rows = self._eval(items)
        live = {j: len(p) for j, p in enumerate(prompts)}  # sequence -> next position
        row_of = {j: row for j, row in zip(sorted(live), logits_rows)}
        while live:
            now = time.time()
            step = []
            for j in list(live):
                token = self._argmax(row_of[j])
                seq = seqs[j]
                seq.tokens.append(token)
                seq.times.append(now)
                if len(seq.tokens) >= max_tokens or (stop_at_eos and lib.llama_vocab_is_eog(self.vocab, token)):
                    del live[j]
                else:
                    step.append((token, live[j], [j], True))
                    live[j] += 1
            if step:
                row_of = dict(zip([s[2][0] for s in step], self._eval(step)))
        return seqs

    def _eval(self, items: list[tuple[int, int, list[int], bool]]) -> list[int]:
        """Decode (token, pos, seq_ids, want_logits) items in n_batch chunks; returns the logits rows wanted.

        A row index is only valid until the next decode, so rows come from the last chunk: the callers put
        every token that wants logits in the final chunk (suffixes are short; decode steps fit one batch).
        """
        lib, batch = self.lib, self.batch
        rows: list[int] = []
        for c in range(0, len(items), self.n_batch):
            chunk = items[c:c + self.n_batch]
            rows = []
            for i, (token, pos, seq_ids, logits) in enumerate(chunk):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, len(seq_ids)
                for k, s in enumerate(seq_ids):
                    batch.seq_id[i][k] = s
                batch.logits[i] = logits
                if logits:
                    rows.append(i)
            batch.n_tokens = len(chunk)
            if lib.llama_decode(self.ctx, batch) != 0:
                raise RuntimeError("llama_decode failed")
            if rows and c + self.n_batch < len(items):
                raise RuntimeError("logits wanted outside the last chunk")
        return rows

    def _argmax(self, row: int) -> int:
        ptr = self.lib.llama_get_logits_ith(self.ctx, row)
        return int(self.np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)),
                                             shape=(self.n_vocab,)).argmax())


class LlamaCppBatchedRunner(Runner):
    name = "llamacpp-batched"

    def __init__(self, options):
        from .llamacpp import model_shape
        try:
            load_binding()
        except ImportError as exc:
            raise SystemUnavailable(f"llama-cpp-python is not installed (scripts/install_llamacpp.sh): {exc}") from exc
        gguf = options.model_path or default_model_path()
        if not gguf.endswith(".gguf"):
            raise SystemUnavailable(f"llama.cpp needs a .gguf file, got {gguf}")
        self.shape = model_shape(gguf, options.cache_dir)
        self.llm = MultiSequenceLlama(gguf, options.llamacpp_threads)

    def run(self, workload: Workload) -> tuple[list[RequestRecord], PhaseStats | None]:
        arrival = time.time()
        try:
            seqs = self.llm.generate(workload.prompts, workload.max_tokens)
        except Exception as exc:  # noqa: BLE001  (the whole call failed: every request counts as failed)
            return [failed_record(f"{workload.name}-{i}", p, arrival, time.time(), exc)
                    for i, p in enumerate(workload.prompts)], None
        return [RequestRecord(f"{workload.name}-{s.index}", len(workload.prompts[s.index]), len(s.tokens),
                              arrival, s.start, s.times[0], s.times[-1], cached_tokens=s.cached_tokens)
                for s in seqs], None

    def close(self) -> None:
        self.llm.close()
