import os

# torch scans every installed package's entry points for out-of-tree device backends at import (~0.1 s);
# the engine runs on cpu or cuda only. An explicit setting still wins.
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

from batchinfer.cli.app import app  # noqa: E402

__all__ = ["app"]
