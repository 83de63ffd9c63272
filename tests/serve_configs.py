"""``tokenops.toml`` text for the serve tests: ``[[models]]`` tables and ``[section]`` blocks.

The serve tests each spelled the same ``[[models]]\\nname = ...\\nbackend = "local"\\npath = ...``
preamble by hand; written here once, with values quoted as TOML wants (a path or URL is a TOML
string, a list a TOML array), so a test reads as which model and which options it serves.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def toml_value(value: Any) -> str:
    """``value`` as a TOML literal: strings (and paths) quoted, lists as arrays, dicts as inline tables."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (str, Path)):
        return json.dumps(str(value))  # a JSON string is a TOML basic string (same escapes)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML literal for {type(value).__name__}")


def model(name: str, **fields: Any) -> str:
    """One ``[[models]]`` table: ``model("m", backend="openai", url=up.url)``."""
    return "[[models]]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in {"name": name, **fields}.items())


def local_model(name: str, path: str | Path, **fields: Any) -> str:
    """A model served by the bundled engine from the HF folder or GGUF file ``path``."""
    return model(name, backend="local", path=path, **fields)


def openai_model(name: str, url: str | None = None, **fields: Any) -> str:
    """A model behind an OpenAI-compatible upstream (``url``, or ``urls=[...]`` for replicas)."""
    return model(name, backend="openai", **({"url": url} if url is not None else {}), **fields)


def section(name: str, **fields: Any) -> str:
    """A ``[name]`` block: ``section("plugins.quantization", weights="int8")``."""
    return f"[{name}]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in fields.items())


def config(*parts: str) -> str:
    """The tables and blocks of one ``tokenops.toml``, a blank line between them."""
    return "\n".join(parts)
