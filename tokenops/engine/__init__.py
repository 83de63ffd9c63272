"""The bundled inference engine: paged KV cache, continuous batching with chunked
prefill, prefix caching, Hugging Face checkpoints (see DESIGN.md).

Importing this package is cheap; the public classes load on first access:
``LLMEngine``, ``AsyncLLMEngine``, ``SamplingParams``, ``EngineConfig``,
``ModelRunner``, ``ChunkInput``, ``Tokenizer``, ``EnginePolicies`` (the policies an engine
takes as constructor arguments; contracts in :mod:`tokenops.engine.core.protocols`).
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "LLMEngine": "tokenops.engine.core.engine",
    "AsyncLLMEngine": "tokenops.engine.core.async_engine",
    "SamplingParams": "tokenops.engine.sampling.sampling",
    "EngineConfig": "tokenops.engine.core.config",
    "EnginePolicies": "tokenops.engine.core.policies",
    "RequestOutput": "tokenops.engine.core.outputs",
    "CompletionOutput": "tokenops.engine.core.outputs",
    "ModelRunner": "tokenops.engine.core.model_runner",
    "ChunkInput": "tokenops.engine.core.batch",
    "Tokenizer": "tokenops.engine.core.tokenizer",
    "IncrementalDetokenizer": "tokenops.engine.core.tokenizer",
    "default_model_dir": "tokenops.engine.models.default_model",
    "default_model_name": "tokenops.engine.models.default_model",
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
