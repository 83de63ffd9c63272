"""Layer 2: model optimization plugins (speculative decoding, quantization, KV, MoE)."""
