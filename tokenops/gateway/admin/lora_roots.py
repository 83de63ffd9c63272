"""What ``POST /admin/lora`` may read: adapter names, folders under the configured roots, and an
``adapter_config.json`` checked field by field before the engine reads it.

The admin API loads files from the server's disk, so it reads only under ``[lora] roots`` (by
default the store folder's ``adapters/`` and the shipped demo adapters). A path outside them gets
one answer whether or not anything exists there (nothing is looked at before the check, and
symbolic links are resolved first, so a link inside a root cannot point out of it). Adapters given
at start (``[[models]] lora``, ``--lora``) are the operator's choice and may sit anywhere.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

from pydantic_core import from_json

from tokenops.gateway.errors import APIError

#: An adapter's name is a model name in every endpoint, a label on /metrics and a folder-safe word.
ADAPTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: ``adapter_config.json`` files larger than this are refused unread (PEFT's are ~1 KB).
MAX_CONFIG_BYTES = 256 * 1024
#: The shipped demo adapters (package data, read-only): always a root when none is configured.
SHIPPED_ADAPTERS = Path(__file__).resolve().parents[1] / "demo_models" / "adapters"


def check_name(name: str) -> str:
    if not ADAPTER_NAME.fullmatch(name):
        raise APIError(
            400,
            f"name {name[:80]!r}: an adapter name is 1-64 letters, digits, '.', '_' or '-', starting with a "
            "letter or digit",
            code="invalid_value",
            param="name",
        )
    return name


def adapter_roots(configured: list[str], store_path: str | None) -> list[Path]:
    """The folders adapters may be loaded from, symbolic links resolved."""
    if configured:
        folders = [Path(r).expanduser() for r in configured]
    else:
        folders = [SHIPPED_ADAPTERS]
        if store_path and store_path != ":memory:":
            folders.insert(0, Path(store_path).expanduser().parent / "adapters")
    return [Path(os.path.realpath(f)) for f in folders]


def resolve_under_roots(path: str, roots: list[Path]) -> Path:
    """``path`` with links resolved, when it lies inside one of ``roots``; else one 400 that says the
    same whether or not ``path`` exists (nothing under it is read before this check)."""
    try:
        real = Path(os.path.realpath(Path(path).expanduser()))
    except (ValueError, OSError, RuntimeError):  # a NUL byte, a lone surrogate, a name too long, ~nouser
        real = None
    if real is not None and any(real == root or root in real.parents for root in roots):
        return real
    shown = ", ".join(str(r) for r in roots) or "none"
    raise APIError(
        400,
        # the same text for every refused path (not even the path itself), so no answer tells
        # what exists outside the roots
        f"path: not inside an adapter root ({shown}); put the adapter folder under one, or add its "
        "parent folder to [lora] roots in tokenops.toml and restart",
        code="lora_path_not_allowed",
        param="path",
    )


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)


#: Fields the engine reads (tokenops/engine/lora/lora_adapters.py), with the JSON they must hold.
_CONFIG_FIELDS: dict[str, tuple[str, Any]] = {
    "peft_type": ("a string (LORA)", lambda v: isinstance(v, str)),
    "r": ("a positive integer", lambda v: _is_int(v) and v >= 1),
    "lora_alpha": ("a finite number", lambda v: v is None or _is_number(v)),
    "use_rslora": ("true or false", lambda v: v is None or isinstance(v, bool)),
    "use_dora": ("true or false", lambda v: v is None or isinstance(v, bool)),
    "fan_in_fan_out": ("true or false", lambda v: v is None or isinstance(v, bool)),
    "bias": ("a string", lambda v: v is None or isinstance(v, str)),
    "base_model_name_or_path": ("a string", lambda v: v is None or isinstance(v, str)),
    "target_modules": (
        "a string or a list of strings",
        lambda v: v is None or isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v)),
    ),
    "modules_to_save": ("a list", lambda v: v is None or isinstance(v, list)),
    "rank_pattern": ("an object", lambda v: v is None or isinstance(v, dict)),
    "alpha_pattern": ("an object", lambda v: v is None or isinstance(v, dict)),
    "layers_to_transform": ("an integer or a list", lambda v: v is None or _is_int(v) or isinstance(v, list)),
}


def _bad_config(message: str) -> APIError:
    return APIError(400, f"adapter_config.json: {message}"[:400], code="invalid_lora_adapter", param="path")


def check_adapter_config(folder: Path) -> None:
    """A 400 naming the field when ``folder/adapter_config.json`` is not what the engine can read (a
    missing file is left to the engine, which names both files a folder needs)."""
    cfg_file = folder / "adapter_config.json"
    try:
        if not cfg_file.is_file():
            return
        if cfg_file.stat().st_size > MAX_CONFIG_BYTES:
            raise _bad_config(f"larger than {MAX_CONFIG_BYTES} bytes; a PEFT adapter's config is about 1 KB")
        raw = cfg_file.read_bytes()
    except OSError as e:
        raise _bad_config(f"cannot be read ({type(e).__name__})") from None
    try:
        cfg = from_json(raw, allow_inf_nan=False)  # refuses NaN, Infinity and nesting deeper than 200 levels
    except ValueError as e:
        raise _bad_config(f"not valid JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise _bad_config(f"must be a JSON object, got {type(cfg).__name__}")
    if "r" not in cfg:
        raise _bad_config('"r" (the rank) is missing')
    for name, (what, is_ok) in _CONFIG_FIELDS.items():
        if name in cfg and not is_ok(cfg[name]):
            raise _bad_config(f'"{name}" must be {what}, got {str(cfg[name])[:60]!r}')
