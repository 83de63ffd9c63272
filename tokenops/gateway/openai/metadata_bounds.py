"""``metadata`` as OpenAI bounds it, on every API that takes it (chat completions, Responses):
at most 16 key-value pairs, keys up to 64 characters, string values up to 512 characters.
Stored with a response, it would otherwise be megabytes per row."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

METADATA_PAIRS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 16, 64, 512


def check_metadata(value: dict[str, str]) -> dict[str, str]:
    """``value`` when within the bounds; a ``ValueError`` saying which one it passes otherwise."""
    if len(value) > METADATA_PAIRS:
        raise ValueError(f"at most {METADATA_PAIRS} key-value pairs, got {len(value)}")
    for key, text in value.items():
        if len(key) > METADATA_KEY_CHARS:
            raise ValueError(f"keys are at most {METADATA_KEY_CHARS} characters; {key[:16]!r}... has {len(key)}")
        if len(text) > METADATA_VALUE_CHARS:
            raise ValueError(f"values are at most {METADATA_VALUE_CHARS} characters; {key!r} has {len(text)}")
    return value


#: The field type: the bounds checked (the 400 names ``metadata``) and stated in the JSON schema.
Metadata = Annotated[
    dict[str, str],
    AfterValidator(check_metadata),
    Field(
        json_schema_extra={
            "maxProperties": METADATA_PAIRS,
            "propertyNames": {"maxLength": METADATA_KEY_CHARS},
            "additionalProperties": {"type": "string", "maxLength": METADATA_VALUE_CHARS},
        }
    ),
]
