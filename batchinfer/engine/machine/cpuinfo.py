"""The CPU's identity and flags from /proc/cpuinfo, read once per process (dtype auto, weight_format auto, the
quantized kernel's check and the invariance probe's cache key all ask)."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

FIELDS = ("vendor_id", "cpu family", "model", "model name", "stepping", "cache size", "flags")


@lru_cache(maxsize=1)
def cpu_info() -> dict[str, str]:
    """The first processor's FIELDS (flags sorted, space-separated); empty where there is no /proc/cpuinfo."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        name, _, value = line.partition(":")
        if name.strip() in FIELDS:
            fields[name.strip()] = " ".join(sorted(value.split())) if name.strip() == "flags" else value.strip()
    return fields


def cpu_flags() -> frozenset[str]:
    return frozenset(cpu_info().get("flags", "").split())
