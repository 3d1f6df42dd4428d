"""A scheduled batch run through the model: flat tensors in, sampled tokens and pooled embeddings out, and the
start-up probe that keeps the dense matmuls batch-invariant on this machine."""
