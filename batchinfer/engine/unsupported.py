"""The errors a checkpoint the engine cannot run raises at load, each one line naming what it cannot run."""
from __future__ import annotations


class UnsupportedModelError(ValueError):
    def __init__(self, architecture: str, feature: str | None = None):
        what = f"{feature} is not supported" if feature else "is not an architecture the engine runs"
        super().__init__(f"unsupported model {architecture}: {what}")


class UnsupportedWeightFormat(ValueError):
    """This checkpoint cannot run in the asked weight format on this machine (the reason is the message)."""


class UnsupportedGGUF(ValueError):
    """A GGUF file the engine cannot run: an architecture or a block type it does not read (one line naming it)."""
