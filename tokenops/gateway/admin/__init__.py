"""The admin API (``/admin/...``, admin key required): stats, tunables, keys, LoRA adapters, memory, distillation pairs."""
