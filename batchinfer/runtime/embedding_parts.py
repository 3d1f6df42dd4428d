"""An embeddings line with several inputs runs as one engine request per input ("<request id>#<k>"); their
results are joined again, in input order, before the line's output is written."""
from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Iterator

from batchinfer.engine.types import GenerationRequest, GenerationResult

PART = "#"


def expand(request: GenerationRequest, inputs: list[list[int]] | None) -> list[GenerationRequest]:
    if not inputs or len(inputs) < 2:
        return [request]
    return [GenerationRequest(f"{request.request_id}{PART}{k}", list(ids), replace(request.sampling))
            for k, ids in enumerate(inputs)]


def grouped(results: Iterable[GenerationResult], parts: dict[str, int]) -> Iterator[tuple[str, list[GenerationResult]]]:
    """(request id, its results): one result, or each part's once all have come (parts: id -> count)."""
    pending: dict[str, list[GenerationResult]] = {}
    for result in results:
        request_id, _, _ = result.request_id.partition(PART)
        if request_id not in parts:
            yield request_id, [result]
            continue
        got = pending.setdefault(request_id, [])
        got.append(result)
        if len(got) == parts[request_id]:
            yield request_id, sorted(pending.pop(request_id), key=lambda r: int(r.request_id.rpartition(PART)[2]))
