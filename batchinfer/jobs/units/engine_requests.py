"""A unit's requests as the engine runs them: one engine request each, or one per input of an embeddings line
(part k), every engine id mapped back to its typed key; results come back grouped by request, parts in order. A
line naming one of the worker's adapters runs with it (its LoRARequest)."""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace

from batchinfer.engine.lora.request import LoRARequest
from batchinfer.engine.types import GenerationRequest, GenerationResult
from batchinfer.jobs.records import RequestKey, UnitRequest


class EngineRequests:
    def __init__(self, requests: list[UnitRequest], adapters: Mapping[str, LoRARequest] | None = None,
                 refused: Mapping[str, str] | None = None):
        self.keys: dict[str, RequestKey] = {}  # engine id -> key (with its part)
        self.ids: dict[RequestKey, list[str]] = {}  # a request's key -> the engine ids it runs under
        self.generation: list[GenerationRequest] = []
        self.refused: list[GenerationResult] = []  # lines of an adapter that could not be had: failed, never run
        for r in requests:
            inputs = (r.request.echo or {}).get("inputs") or [r.request.prompt_token_ids]
            parts = [RequestKey(r.job_id, r.request.index, k) for k in range(len(inputs))] if len(inputs) > 1 else [r.key]
            self.ids[r.key] = [key.engine_id for key in parts]
            for key, ids in zip(parts, inputs):
                self.keys[key.engine_id] = key
                # a copy: the engine may set fields (arrival_time) on what it is given
                request = GenerationRequest(key.engine_id, list(ids), replace(r.request.sampling),
                                            cache_salt=r.cache_salt, lora_request=(adapters or {}).get(r.request.model))
                if refused and r.request.model in refused:
                    self.refused.append(GenerationResult.failed(request, refused[r.request.model]))
                else:
                    self.generation.append(request)

    def key_of(self, result: GenerationResult) -> RequestKey:
        return self.keys[result.request_id]

    def grouped(self, results: Iterable[GenerationResult]) -> Iterator[tuple[RequestKey, list[GenerationResult]]]:
        """(request key, its results): one result, or each part's once all of them have come, in input order."""
        pending: dict[RequestKey, list[GenerationResult]] = {}
        for result in results:
            key = self.key_of(result).whole()
            got = pending.setdefault(key, [])
            got.append(result)
            if len(got) == len(self.ids[key]):
                yield key, sorted(pending.pop(key), key=lambda r: self.key_of(r).part or 0)
