"""Our own forward passes, one file per model family."""
from .llama import LlamaForCausalLM

__all__ = ["LlamaForCausalLM"]
