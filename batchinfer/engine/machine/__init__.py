"""What this machine has: its CPU flags, the dtype auto picks, the C kernels built for it."""
