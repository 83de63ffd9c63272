"""Field types that validate JSON as JSON Schema reads it.

Request models are validated strictly (``"yes"`` is no boolean, ``1`` is no string),
but JSON Schema calls ``12.0`` an integer, and so do the clients that generate bodies
from the OpenAPI document: :data:`JsonInt` takes an integral float as the integer it
is, and refuses booleans (``true`` is no number) and fractions.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field


def _json_int(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    return value  # anything else is judged by the strict int check that follows


#: Put after the bounds in ``Annotated[int, Field(strict=True, ge=.., le=..), INTEGRAL_FLOAT]``: the
#: bounds before the validator, or the JSON schema shows them as raw ge/le instead of
#: ``minimum``/``maximum`` inside ``X | None``. Written out (not built by a call) so type checkers read it.
INTEGRAL_FLOAT = BeforeValidator(_json_int)

JsonInt = Annotated[int, Field(strict=True), INTEGRAL_FLOAT]


def json_int(**bounds: Any) -> Any:
    """:data:`JsonInt` with bounds (``ge``, ``le``) that the OpenAPI document shows as
    ``minimum``/``maximum`` also inside ``X | None``."""
    # the bounds before the validator: after it, the JSON schema shows them as raw ge/le
    return Annotated[int, Field(strict=True, **bounds), INTEGRAL_FLOAT]
