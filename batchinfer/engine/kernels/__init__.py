"""Triton kernels over the paged KV cache (store, extend, decode). Their plain torch references, and the
random paged batches the kernel tests and benchmarks/gpu_check.py run them on, live beside the product in
benchmarks/support/ (kernel_reference.py, paged_batch.py): only tests and benchmarks use them."""
