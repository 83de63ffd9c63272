"""Layer 4: compute-network-model fusion plugins (replica selection, caches, limits, breakers)."""
