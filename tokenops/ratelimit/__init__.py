"""Rate limits and quotas for the gateway: token buckets (requests/min, tokens/min)
per tenant, model and API key, concurrency caps, weighted fair share of a global
token capacity, kept in-process or in Redis so several gateways share one limit."""
