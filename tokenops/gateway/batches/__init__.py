"""The Batch API room (``/v1/batches``, and ``/admin/batches`` for the dashboard): the wire API,
the lines' translation into pipeline requests, and the runner that feeds them on idle capacity
(docs/batches.md)."""

from fastapi import APIRouter

from tokenops.gateway.batches.batches_admin import router as admin_router
from tokenops.gateway.batches.batches_api import router as api_router

router = APIRouter()
router.include_router(api_router)
router.include_router(admin_router)

__all__ = ["router"]
