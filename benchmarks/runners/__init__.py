"""One runner per compared system; each turns a Workload into RequestRecords and phase statistics."""
from __future__ import annotations

from .base import Runner, SystemUnavailable


def make_runner(system: str, options) -> Runner:
    if system == "engine":
        from .engine import EngineRunner
        return EngineRunner(options)
    if system == "hf-single":
        from .hf import HFRunner
        return HFRunner(options, batch_size=1, name=system)
    if system == "hf-padded":
        from .hf import HFRunner
        return HFRunner(options, batch_size=options.hf_batch_size, name=system)
    if system == "llamacpp":
        from .llamacpp import LlamaCppRunner
        return LlamaCppRunner(options)
    if system == "llamacpp-sorted":
        from .llamacpp import LlamaCppRunner
        return LlamaCppRunner(options, sort_prompts=True)
    if system == "llamacpp-batched":
        from .llamacpp_batched import LlamaCppBatchedRunner
        return LlamaCppBatchedRunner(options)
    raise ValueError(f"unknown system {system!r}")


__all__ = ["Runner", "SystemUnavailable", "make_runner"]
