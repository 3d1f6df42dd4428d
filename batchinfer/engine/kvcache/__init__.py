"""The paged KV cache's blocks: allocated, shared by prefix, copied on write, evicted (no torch in the manager)."""
