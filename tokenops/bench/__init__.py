"""Benchmarking: workloads, arrival processes, the load generator, SLO-aware metrics."""
