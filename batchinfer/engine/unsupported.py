"""The one error a checkpoint the engine cannot run raises at load: the architecture and what is missing."""
from __future__ import annotations


class UnsupportedModelError(ValueError):
    def __init__(self, architecture: str, feature: str | None = None):
        what = f"{feature} is not supported" if feature else "is not an architecture the engine runs"
        super().__init__(f"unsupported model {architecture}: {what}")
