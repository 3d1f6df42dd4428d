"""How OpenMP threads wait between parallel regions, chosen before torch loads libgomp (it reads this once).

A decode step is a few hundred parallel regions (every projection and attention call) with tens of microseconds
of Python between them. Sleeping at once (PASSIVE) pays a wake-up at each: on a quiet 2-core Xeon a 16 x 128
decode run took 9.3-9.6 s against 7.1-7.3 s with a short spin. Spinning where another process wants the core
is worse still: the spinner holds it while its partner waits (two runs side by side: 22-28 s spinning against
12-19 s sleeping; docs/benchmarks.md, "OpenMP wait policy"). So: a short, bounded spin (then sleep, so an idle
worker burns nothing) when the machine has a core to spare, sleep at once when it is busy. A user's setting wins.
"""
from __future__ import annotations

import os

SPIN = "20000"  # libgomp's spin iterations before a thread sleeps (its own default is 300,000)


def wait_policy(environ: dict[str, str] | os._Environ, load: float, cores: int) -> dict[str, str]:
    """The variables to add to environ: none where the user set either; a short spin on a machine whose
    1-minute load leaves half its cores free; else PASSIVE."""
    if "OMP_WAIT_POLICY" in environ or "GOMP_SPINCOUNT" in environ:
        return {}
    return {"GOMP_SPINCOUNT": SPIN} if load <= cores / 2 else {"OMP_WAIT_POLICY": "PASSIVE"}


def choose() -> dict[str, str]:
    chosen = wait_policy(os.environ, os.getloadavg()[0], os.cpu_count() or 1)
    os.environ.update(chosen)
    return chosen
