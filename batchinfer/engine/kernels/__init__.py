"""Triton kernels over the paged KV cache (store, extend, decode) and their plain torch references."""
