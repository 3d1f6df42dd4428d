import os

# torch scans every installed package's entry points for out-of-tree device backends at import (~0.1 s);
# the engine runs on cpu or cuda only. An explicit setting still wins.
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
# numpy's OpenBLAS starts a thread per core at import that spins ~0.1 s waiting for work (nothing here calls numpy's
# BLAS: torch has its own); on 2 cores the spinners of both processes took the CPU torch's import needed (one
# request 1.52 -> 1.42 s, docs/benchmarks.md). An explicit setting still wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# OpenMP threads spin briefly on a quiet machine, sleep at once on a busy one (cli/openmp.py).
from .openmp import choose as _choose_openmp_wait

_choose_openmp_wait()
