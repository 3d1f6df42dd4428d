"""How OpenMP threads wait between parallel regions, chosen before torch loads libgomp (it reads this once).

A decode step is a few hundred parallel regions (every projection and attention call) with tens of microseconds
of Python between them. Sleeping at once (PASSIVE) pays a wake-up at each, and a quiet machine's decode runs
slower for it. Spinning where another process wants the core is worse still: the spinner holds it while its
partner waits (docs/benchmarks.md, "OpenMP wait policy", has both measured). So: a short, bounded spin (then
sleep, so an idle worker burns nothing) when no other process is running now, sleep at once when one is. A
user's setting wins.
The signal is the kernel's count of runnable tasks at this moment, not the load average, which still counts the
previous job's minute (a benchmark's runs back to back, a worker started after an install).
"""
from __future__ import annotations

import os
import time

SPIN = "20000"  # libgomp's spin iterations before a thread sleeps (its own default is 300,000)


def wait_policy(environ: dict[str, str] | os._Environ, others: int, cores: int) -> dict[str, str]:
    """The variables to add to environ: none where the user set either; a short spin where the other runnable
    tasks would leave nearly every core to our threads (none on 2 cores, up to 4 on 16); else PASSIVE."""
    if "OMP_WAIT_POLICY" in environ or "GOMP_SPINCOUNT" in environ:
        return {}
    return {"GOMP_SPINCOUNT": SPIN} if others <= cores // 4 else {"OMP_WAIT_POLICY": "PASSIVE"}


def other_runnable(samples: int = 5) -> int:
    """Runnable tasks now, this one aside (/proc/loadavg's fourth field), the fewest of a few samples 1 ms apart (a
    kernel thread or a shell can be runnable for an instant; a busy process is in every sample); the 1-minute
    load where there is no /proc."""
    try:
        seen = []
        for i in range(samples):
            with open("/proc/loadavg") as f:
                seen.append(int(f.read().split()[3].split("/")[0]) - 1)
            if i + 1 < samples:
                time.sleep(0.001)
        return max(0, min(seen))
    except (OSError, IndexError, ValueError):
        return round(os.getloadavg()[0])


def choose() -> dict[str, str]:
    chosen = wait_policy(os.environ, other_runnable(), os.cpu_count() or 1)
    os.environ.update(chosen)
    return chosen
