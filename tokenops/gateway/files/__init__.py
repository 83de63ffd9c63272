"""The Files API room (``/v1/files``): uploads of batch input and the batches' output files."""

from tokenops.gateway.files.files_api import router

__all__ = ["router"]
