"""LoRA adapter rows on the fused native step (the products are in :mod:`tokenops.engine._lora_c`).

Without this, a step holding one adapter row left the fused step for the PyTorch forward — on the
default GGUF model several times slower per step than the fused step, whatever the adapter costs
(docs/lora.md). Here the step stays native: :class:`NativeLora` describes each loaded adapter once
(per layer and projection, the addresses of its A and B matrices, see ``tk_lora_adapter``) and,
per step, which rows use which adapter (``tk_lora``); the C step adds ``(x A^T) B^T`` to those rows
after each product. The adapter's tensors are the ones :class:`~tokenops.engine.lora.LoraSet`
holds (float32, contiguous): nothing is copied.
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch

from tokenops.engine.lora import LoraAdapter

#: our module -> the projection index the C step passes to ``lora_add``
PROJECTIONS = {"self_attn.qkv_proj": 0, "self_attn.o_proj": 1, "mlp.gate_up_proj": 2, "mlp.down_proj": 3}
_i64, _p = ctypes.c_int64, ctypes.c_void_p


class _Part(ctypes.Structure):
    _fields_ = [("a", _p), ("b", _p), ("r", _i64), ("n", _i64), ("off", _i64), ("t", _i64)]


class _Adapter(ctypes.Structure):
    _fields_ = [("parts", _p), ("start", _p)]


class _Step(ctypes.Structure):
    _fields_ = [("nseg", _i64), ("adapters", _p), ("seg", _p), ("rows", _p), ("t", _p), ("tw", _i64)]


class _Record:
    """One adapter as the C step reads it (kept while the adapter is loaded)."""

    def __init__(self, adapter: LoraAdapter, num_layers: int) -> None:
        self.adapter = adapter
        parts: list[_Part] = []
        start = [0]
        self.width = 0  # widest T row of a projection: sum of its parts' ranks
        for layer in range(num_layers):
            for module in PROJECTIONS:
                w = adapter.weights.get((layer, module))
                if w is not None:
                    for j, (off, b) in enumerate(w.parts):
                        r, n = b.shape[1], b.shape[0]
                        a = w.a[j * r:(j + 1) * r]
                        parts.append(_Part(a.data_ptr(), b.data_ptr(), r, n, off, j * r))
                    self.width = max(self.width, w.a.shape[0])
                start.append(len(parts))
        self.parts = (_Part * max(len(parts), 1))(*parts)
        self.start = torch.tensor(start, dtype=torch.long)
        self.struct = _Adapter(ctypes.addressof(self.parts), self.start.data_ptr())


def native_ready(adapter: LoraAdapter) -> bool:
    """Whether the fused step can read ``adapter``'s matrices (float32 on CPU, contiguous)."""
    return all(t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous()
               for w in adapter.weights.values() for t in (w.a, *(b for _, b in w.parts)))


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

    def step(self, row_adapters: list[str | None], adapters: dict[str, LoraAdapter]) -> int:
        """The address of the step's ``tk_lora``: row ``i`` (in the fused step's order: chunk order,
        each chunk's tokens in order) uses ``row_adapters[i]`` (None: the base)."""
        self.forget(adapters)
        by_name: dict[str, list[int]] = {}
        for i, name in enumerate(row_adapters):
            if name is not None:
                by_name.setdefault(name, []).append(i)
        recs = [self._record(adapters[name]) for name in by_name]
        seg, rows = [0], []
        for members in by_name.values():
            rows.extend(members)
            seg.append(len(rows))
        width = max(rec.width for rec in recs)
        if self._t.numel() < len(row_adapters) * width:
            self._t = torch.empty(len(row_adapters) * width)
        structs = (_Adapter * len(recs))(*(rec.struct for rec in recs))
        seg_t, rows_t = torch.tensor(seg, dtype=torch.long), torch.tensor(rows, dtype=torch.long)
        step = _Step(len(recs), ctypes.addressof(structs), seg_t.data_ptr(), rows_t.data_ptr(), self._t.data_ptr(),
                     width)
        self._keep = [structs, seg_t, rows_t, step]
        return ctypes.addressof(step)
