"""Diffusion generation: the mechanisms the ``diffusion`` backend runs (samplers, the
step cache, the split UNet forward it needs, prompt-to-class parsing, the digit
classifier that scores the demo model). Policy (which sampler, how many steps,
which cache threshold) comes from plugins; see docs/engine-optimizations.md."""
