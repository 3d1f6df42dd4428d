"""What crosses the pipe between `batchinfer run` and its engine process (batchinfer/runtime/engine_process.py)."""
from __future__ import annotations

import pickle
from dataclasses import dataclass

from typing import TYPE_CHECKING

from batchinfer.engine.types import EngineDescription, GenerationRequest, GenerationResult

if TYPE_CHECKING:
    from batchinfer.runtime.engine_host import EngineSettings


@dataclass(frozen=True)
class Load:
    settings: EngineSettings  # the model and engine options, as the parent resolved them


@dataclass(frozen=True)
class Loaded:
    description: EngineDescription
    notes: str  # what the load printed on stderr: the parent shows it where a one-process run showed it
    has_step_stats: bool


@dataclass(frozen=True)
class Generate:
    requests: list[GenerationRequest]


@dataclass(frozen=True)
class Abort:
    request_ids: frozenset[str]


@dataclass(frozen=True)
class Result:
    result: GenerationResult  # one request finished (on_result)


@dataclass(frozen=True)
class Returned:
    results: list[GenerationResult]  # generate's return value, in input order


@dataclass(frozen=True)
class AskStepStats:
    pass


@dataclass(frozen=True)
class Failed:
    """An exception of the engine process, to be raised again in the parent as the same type when it can be."""
    type_name: str
    message: str
    pickled: bytes | None

    @classmethod
    def of(cls, exc: BaseException) -> Failed:
        pickled: bytes | None
        try:
            pickled = pickle.dumps(exc)
            pickle.loads(pickled)  # some exceptions pickle but cannot be built again from their args
        except Exception:  # noqa: BLE001 - any: the name and message still travel
            pickled = None
        return cls(type(exc).__name__, str(exc), pickled)

    def exception(self) -> BaseException:
        if self.pickled is not None:
            return pickle.loads(self.pickled)
        # same name, same message: the user reads the line a one-process run printed
        return type(self.type_name, (RuntimeError,), {})(self.message)
