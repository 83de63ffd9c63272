"""The Batch API room (``/v1/batches``): the wire API, the lines' translation into pipeline
requests, and the runner that feeds them on idle capacity (docs/batches.md)."""

from tokenops.gateway.batches.batches_api import router

__all__ = ["router"]
