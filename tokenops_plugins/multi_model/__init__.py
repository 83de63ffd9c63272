"""Layer 1: multi-model fusion plugins (routing, cascade, ensemble, fallback)."""
