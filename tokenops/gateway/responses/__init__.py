"""OpenAI's Responses API (``/v1/responses``): requests, stored chains, output and streamed events."""
