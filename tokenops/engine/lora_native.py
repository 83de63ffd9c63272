"""LoRA adapter rows on the fused native step (the products are in :mod:`tokenops.engine._lora_c`).

Without this, a step holding one adapter row left the fused step for the PyTorch forward — on the
default GGUF model several times slower per step than the fused step, whatever the adapter costs
(docs/lora.md). Here the step stays native: :class:`NativeLora` describes each loaded adapter once
(per layer and projection, the addresses of its A and B matrices, see ``tk_lora_adapter``) and,
per step, which rows use which adapter (``tk_lora``), with the chunks ordered by adapter; the C step
adds ``(x A^T) B^T`` to those rows after each product. The adapter's tensors are the ones :class:`~tokenops.engine.lora_adapters.LoraSet`
holds (float32, contiguous): nothing is copied.
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch

from tokenops.engine.batch import ChunkInput
from tokenops.engine.lora_adapters import LoraAdapter

#: our module -> the projection index the C step passes to ``lora_add``
PROJECTIONS = {"self_attn.qkv_proj": 0, "self_attn.o_proj": 1, "mlp.gate_up_proj": 2, "mlp.down_proj": 3}
_i64, _p = ctypes.c_int64, ctypes.c_void_p


class _Part(ctypes.Structure):
    _fields_ = [("a", _p), ("b", _p), ("r", _i64), ("n", _i64), ("off", _i64), ("t", _i64)]


class _Adapter(ctypes.Structure):
    _fields_ = [("parts", _p), ("start", _p)]


class _Step(ctypes.Structure):
    _fields_ = [("adapters", _p), ("ad", _p), ("t", _p), ("tw", _i64)]


class _Record:
    """One adapter as the C step reads it (kept while the adapter is loaded)."""

    def __init__(self, adapter: LoraAdapter, num_layers: int) -> None:
        if not native_ready(adapter):
            raise ValueError(f"LoRA adapter {adapter.name!r}: the fused step reads float32 matrices on CPU")
        self.adapter = adapter
        parts: list[_Part] = []
        start = [0]
        self.width = 0  # widest T row of a projection: sum of its parts' ranks
        for layer in range(num_layers):
            for module in PROJECTIONS:
                w = adapter.weights.get((layer, module))
                if w is not None:
                    for j, (off, b) in enumerate(w.parts):
                        r, n = b.shape  # B transposed
                        a = w.a[j * r : (j + 1) * r]
                        parts.append(_Part(a.data_ptr(), b.data_ptr(), r, n, off, j * r))
                    self.width = max(self.width, w.a.shape[0])
                start.append(len(parts))
        self.parts = (_Part * max(len(parts), 1))(*parts)
        self.start = torch.tensor(start, dtype=torch.long)
        self.struct = _Adapter(ctypes.addressof(self.parts), self.start.data_ptr())


def native_ready(adapter: LoraAdapter) -> bool:
    """Whether the fused step can read ``adapter``'s matrices (float32 on CPU, contiguous)."""
    return all(
        t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous()
        for w in adapter.weights.values()
        for t in (w.a, *(b for _, b in w.parts))
    )


class NativeLora:
    """Builds the fused step's ``tk_lora`` for a step's rows."""

    def __init__(self, num_layers: int) -> None:
        self.num_layers = num_layers
        self._records: dict[str, _Record] = {}
        self._t = torch.empty(0)
        self._keep: list[Any] = []  # the current step's arrays (alive until the next step)

    def _record(self, adapter: LoraAdapter) -> _Record:
        rec = self._records.get(adapter.name)
        if rec is None or rec.adapter is not adapter:  # new, or unloaded and loaded again
            rec = self._records[adapter.name] = _Record(adapter, self.num_layers)
        return rec

    def forget(self, loaded: dict[str, LoraAdapter]) -> None:
        """Drop the records of adapters no longer loaded (their tensors are freed with them)."""
        for name in [n for n, rec in self._records.items() if loaded.get(n) is not rec.adapter]:
            del self._records[name]

    def step(
        self, chunks: list[ChunkInput], adapters: dict[str, LoraAdapter]
    ) -> tuple[list[ChunkInput], int, list[int] | None]:
        """The step's chunks ordered by adapter (rows of one adapter next to each other, so a thread
        reads its matrices from cache row after row), the address of their ``tk_lora``, and the rows of
        the fused step's logits that give ``chunks``' order (None: the order is unchanged)."""
        self.forget(adapters)
        order = sorted(range(len(chunks)), key=lambda i: (chunks[i].lora is not None, chunks[i].lora or ""))
        ordered = [chunks[i] for i in order]
        names = list(dict.fromkeys(c.lora for c in ordered if c.lora is not None))
        recs = [self._record(adapters[name]) for name in names]
        index = {name: k for k, name in enumerate(names)}
        ad = [index[c.lora] if c.lora is not None else -1 for c in ordered for _ in c.token_ids]
        width = max(rec.width for rec in recs)
        if self._t.numel() < len(ad) * width:
            self._t = torch.empty(len(ad) * width)
        structs = (_Adapter * len(recs))(*(rec.struct for rec in recs))
        ad_t = torch.tensor(ad, dtype=torch.long)
        step = _Step(ctypes.addressof(structs), ad_t.data_ptr(), self._t.data_ptr(), width)
        self._keep = [structs, ad_t, step]
        if order == list(range(len(chunks))):
            return ordered, ctypes.addressof(step), None
        first, at = [0] * len(chunks), 0
        for i in order:
            first[i] = at
            at += chunks[i].num_logits
        rows = [first[i] + j for i in range(len(chunks)) for j in range(chunks[i].num_logits)]
        return ordered, ctypes.addressof(step), rows
