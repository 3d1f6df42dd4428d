import os

# torch scans every installed package's entry points for out-of-tree device backends at import (~0.1 s);
# the engine runs on cpu or cuda only. An explicit setting still wins.
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
# OpenMP threads spin briefly on a quiet machine, sleep at once on a busy one (cli/openmp.py).
from .openmp import choose as _choose_openmp_wait

_choose_openmp_wait()
