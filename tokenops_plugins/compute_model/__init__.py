"""Layer 3: compute-model fusion plugins (engine parameters, compilation, scheduling)."""
