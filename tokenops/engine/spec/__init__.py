"""Speculative decoding: proposers (n-gram, suffix index), verification by rejection sampling."""
