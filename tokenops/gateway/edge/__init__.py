"""The HTTP edge every API shares: bodies read within their limits, guards, SSE responses, the OpenAPI contract, client disconnects."""
