"""Checkpoints and tokenizers: what the engine reads of a model (checkpoint.py), the loaders, the cached layouts."""
