"""The gateway's name for the request-field table (:mod:`tokenops.backends.field_table`, where the
bundled backends that enforce it import it). ``python -m tokenops.gateway.fields`` prints the
tables of docs/serve.md."""

from __future__ import annotations

from tokenops.backends.field_table import (CHAT, COMPLETIONS, EMBEDDINGS, PASS, STRUCTURED, TABLES, Field,
                                           check_bundled_fields, declared, fields, markdown)

__all__ = ["CHAT", "COMPLETIONS", "EMBEDDINGS", "PASS", "STRUCTURED", "TABLES", "Field", "check_bundled_fields",
           "declared", "fields", "markdown"]

if __name__ == "__main__":
    print(markdown(), end="")
