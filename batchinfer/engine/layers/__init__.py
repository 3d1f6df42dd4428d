"""Pieces every model family shares: RoPE variants, norms, gated MLPs, mixture-of-experts."""
