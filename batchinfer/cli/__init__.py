import os

# torch scans every installed package's entry points for out-of-tree device backends at import (~0.1 s);
# the engine runs on cpu or cuda only. An explicit setting still wins.
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
# OpenMP threads sleep as soon as they wait (libgomp reads this once, when torch loads it): spinning cost 3.5-7x in
# wall time on a shared 2-core machine and kept a core busy between steps (docs/benchmarks.md, "OpenMP wait
# policy"). A dedicated quiet machine gains on 32-row decode steps with OMP_WAIT_POLICY=ACTIVE; a setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
