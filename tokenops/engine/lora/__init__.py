"""LoRA adapters: weights, batched product and its native kernel."""
