"""Semantic response cache: embedders (a sentence-embedding model or a lexical
fallback), a vector index, a verifier that rejects look-alikes with a different
meaning, and the cache itself (exact match first, TTL, byte budget, per tenant)."""
