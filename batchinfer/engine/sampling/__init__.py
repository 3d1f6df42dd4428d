"""From logits to tokens: the sampler, logits processors, logprobs, grammars, stop conditions."""
