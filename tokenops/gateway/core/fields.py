"""The gateway's name for the request-field table (:mod:`tokenops.backends.field_table`, where the
bundled backends that enforce it import it). ``python -m tokenops.gateway.core.fields`` prints the
tables of docs/serve.md."""

from __future__ import annotations

from tokenops.backends.field_table import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    PASS,
    STRUCTURED,
    TABLES,
    Field,
    check_bundled_fields,
    fields,
    markdown,
)

__all__ = [
    "CHAT",
    "COMPLETIONS",
    "EMBEDDINGS",
    "PASS",
    "STRUCTURED",
    "TABLES",
    "Field",
    "check_bundled_fields",
    "declared",
    "fields",
    "markdown",
]


def declared(kind: str) -> set[str]:
    """The fields the request schema of ``kind`` declares (pydantic model fields); each has a row
    in the table (a test checks it)."""
    from pydantic import BaseModel

    from tokenops.gateway.openai.embeddings import EmbeddingRequest
    from tokenops.gateway.openai.schemas import ChatCompletionRequest, CompletionRequest

    models: dict[str, type[BaseModel]] = {
        "chat": ChatCompletionRequest,
        "completion": CompletionRequest,
        "embedding": EmbeddingRequest,
    }
    return set(models[kind].model_fields)


if __name__ == "__main__":
    print(markdown(), end="")
