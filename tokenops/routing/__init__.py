"""Replica-selection building blocks for the layer-4 plugins: in-flight load
tracking, a consistent-hash ring with bounded loads, an approximate prefix index
and the selection policies that combine them. Plain Python, no gateway imports."""
