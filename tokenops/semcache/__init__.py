"""Semantic response cache: embedders (a sentence-embedding model or a lexical
fallback), a vector index, a verifier that aligns the content tokens of two prompts
so a look-alike with a different meaning is never served, and the cache itself
(exact match first, TTL, byte budget, per tenant)."""
