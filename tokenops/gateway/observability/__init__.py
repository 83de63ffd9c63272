"""What the gateway lets operators see: Prometheus ``/metrics``, the sliding-window stats, traces and engine telemetry."""
