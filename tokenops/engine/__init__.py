"""The bundled inference engine: paged KV cache, continuous batching with chunked
prefill, prefix caching, Hugging Face checkpoints (see DESIGN.md).

Importing this package is cheap; the public classes load on first access:
``LLMEngine``, ``AsyncLLMEngine``, ``SamplingParams``, ``EngineConfig``,
``ModelRunner``, ``ChunkInput``, ``Tokenizer``, ``EnginePolicies`` (the policies an engine
takes as constructor arguments; contracts in :mod:`tokenops.engine.protocols`).
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "LLMEngine": "tokenops.engine.engine",
    "AsyncLLMEngine": "tokenops.engine.async_engine",
    "SamplingParams": "tokenops.engine.sampling",
    "EngineConfig": "tokenops.engine.config",
    "EnginePolicies": "tokenops.engine.policies",
    "RequestOutput": "tokenops.engine.outputs",
    "CompletionOutput": "tokenops.engine.outputs",
    "ModelRunner": "tokenops.engine.model_runner",
    "ChunkInput": "tokenops.engine.batch",
    "Tokenizer": "tokenops.engine.tokenizer",
    "IncrementalDetokenizer": "tokenops.engine.tokenizer",
    "default_model_dir": "tokenops.engine.default_model",
    "default_model_name": "tokenops.engine.default_model",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tokenops.engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
