"""What the Responses routes ask of stored responses, whichever store keeps them.

Two implementations: :class:`tokenops.store.stored_responses.ResponseStore` (the embedded
default: the gateway's own DuckDB store, one process) and
:class:`tokenops.shared_state.postgres_responses.PostgresResponseStore` (``[shared]
postgres_url``: every gateway replica of a service reads and writes the same rows). Both keep
the same semantics, checked by running one scenario against both
(tests/shared_state/test_response_store_conformance.py): per tenant (a foreign id reads as
missing), bounded by age and count per tenant, chains stored as links with byte bounds checked
from the previous row alone, deleted links kept hidden while a later turn still needs them.

Every call blocks (DuckDB work, or a round trip to PostgreSQL): the gateway runs them in a
worker thread.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from tokenops.store.stored_responses import ChainHead, Limits, StoredResponse


@runtime_checkable
class ResponseStore(Protocol):
    """Stored ``/v1/responses`` answers and their ``previous_response_id`` chains, per tenant."""

    #: The bounds: age, count per tenant, bytes per response and per chain.
    limits: Limits

    def save(
        self,
        tenant: str,
        response: dict[str, Any],
        input_items: list[dict[str, Any]],
        previous_response_id: str | None = None,
        num_history: int = 0,
    ) -> bool:
        """Keep ``response`` (answering ``input_items``, whose first ``num_history`` came from
        ``previous_response_id``); False, and nothing written, when it would pass a bound."""
        ...

    def head(self, tenant: str, response_id: str) -> ChainHead | None:
        """The tenant's response as the start of a next turn (its chain's sums); None when missing,
        expired, deleted or another tenant's."""
        ...

    def response(self, tenant: str, response_id: str) -> dict[str, Any] | None:
        """The Response object of ``response_id`` (None as for :meth:`head`)."""
        ...

    def conversation(self, tenant: str, response_id: str, with_output: bool = True) -> list[dict[str, Any]]:
        """Every item of the chain ending at ``response_id``, oldest first."""
        ...

    def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        """The response with the conversation it answered (None as for :meth:`head`)."""
        ...

    def row_sizes(self, tenant: str) -> dict[str, int]:
        """Stored bytes per response of ``tenant`` (hidden links included)."""
        ...

    def delete(self, tenant: str, response_id: str) -> bool:
        """Hide ``response_id`` (its row goes once nothing links to it); False when not found."""
        ...

    def purge_tenant(self, tenant: str) -> int:
        """Delete every stored response of ``tenant``; returns how many were served by id."""
        ...

    def count(self, tenant: str | None = None) -> int:
        """Responses served by id (hidden links not counted), of one tenant or all."""
        ...
