"""Keeping traffic away from failing replicas: circuit breakers, latency-outlier
ejection and health probes, combined per replica by :class:`ReplicaHealth`."""
