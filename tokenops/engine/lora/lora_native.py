"""LoRA adapter rows on the fused native step (the products are in ``tokenops/engine/csrc/lora.c``).

Without this, a step holding one adapter row left the fused step for the PyTorch forward — on the
default GGUF model several times slower per step than the fused step, whatever the adapter costs
(docs/lora.md). Here the step stays native: :class:`NativeLora` describes each loaded adapter once
(per layer and projection, the addresses of its A and B matrices, see ``tk_lora_adapter``) and, per
step, which rows use which adapter and the rows in tiles of one adapter (``tk_lora``); the C step
adds ``(x A^T) B^T`` to those rows after each product, a tile at a time. The adapter's tensors are
the ones :class:`~tokenops.engine.lora.lora_adapters.LoraSet` holds (float32, contiguous): nothing is
copied.
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch

from tokenops.engine.core.batch import ChunkInput
from tokenops.engine.kernels.c_header import check_struct, read
from tokenops.engine.lora.lora_adapters import LoraAdapter

#: our module -> the projection index the C step passes to ``lora_add``
PROJECTIONS = {"self_attn.qkv_proj": 0, "self_attn.o_proj": 1, "mlp.gate_up_proj": 2, "mlp.down_proj": 3}
_i64, _p = ctypes.c_int64, ctypes.c_void_p
#: rows per tile of the C products (``TK_LORA_TILE`` in ``csrc/fused_decode.h``)
TILE = read("fused_decode.h").defines["TK_LORA_TILE"]


class _Part(ctypes.Structure):  # the structures of csrc/fused_decode.h (checked when NativeLora is built)
    _fields_ = [("a", _p), ("b", _p), ("r", _i64), ("n", _i64), ("off", _i64), ("t", _i64)]


class _Adapter(ctypes.Structure):
    _fields_ = [("parts", _p), ("start", _p)]


class _Step(ctypes.Structure):
    _fields_ = [
        ("adapters", _p),
        ("ad", _p),
        ("t", _p),
        ("tw", _i64),
        ("ntiles", _i64),
        ("tile", _p),
        ("rows", _p),
    ]


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
        for cls, name in ((_Part, "tk_lora_part"), (_Adapter, "tk_lora_adapter"), (_Step, "tk_lora")):
            check_struct(cls, name, "fused_decode.h")
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

    def step(self, chunks: list[ChunkInput], adapters: dict[str, LoraAdapter]) -> int:
        """The address of the step's ``tk_lora`` for ``chunks`` (rows in chunk order, unchanged): each
        row's adapter, and the rows in tiles of at most :data:`TILE` of one adapter, each adapter's
        tiles next to each other (a thread reads its matrices from cache tile after tile)."""
        self.forget(adapters)
        names = list(dict.fromkeys(c.lora for c in chunks if c.lora is not None))
        recs = [self._record(adapters[name]) for name in names]
        index = {name: k for k, name in enumerate(names)}
        ad = [index[c.lora] if c.lora is not None else -1 for c in chunks for _ in c.token_ids]
        tile, rows = tiles(ad)
        width = max(rec.width for rec in recs)
        if self._t.numel() < len(ad) * width:
            self._t = torch.empty(len(ad) * width)
        structs = (_Adapter * len(recs))(*(rec.struct for rec in recs))
        arrays = [torch.tensor(v, dtype=torch.long) for v in (ad, tile, rows)]
        step = _Step(ctypes.addressof(structs), arrays[0].data_ptr(), self._t.data_ptr(), width)
        step.ntiles, step.tile, step.rows = len(tile) - 1, arrays[1].data_ptr(), arrays[2].data_ptr()
        self._keep = [structs, arrays, step]
        return ctypes.addressof(step)


def tiles(ad: list[int]) -> tuple[list[int], list[int]]:
    """The step's rows (``ad``: each row's adapter index, -1 the base) in tiles of at most :data:`TILE`
    rows of one adapter: (tile starts in ``rows`` and its end, every row once, grouped by adapter)."""
    groups: dict[int, list[int]] = {}
    for m, a in enumerate(ad):
        groups.setdefault(a, []).append(m)
    tile, rows = [0], []
    for group in groups.values():
        for i in range(0, len(group), TILE):
            rows.extend(group[i : i + TILE])
            tile.append(len(rows))
    return tile, rows


def apply_products(lib: ctypes.CDLL, step: int, layer: int, projection: int, x: torch.Tensor, y: torch.Tensor) -> None:
    """``y += (x A^T) B^T`` for every row of a step (``step``: the address :meth:`NativeLora.step`
    gave) on one projection of one layer, by the fused step's own C products, tile by tile, outside
    the step: how the tests check them against torch. ``x`` [rows, in], ``y`` [rows, out], float32."""
    for t in (x, y):
        if t.dtype != torch.float32 or not t.is_contiguous():
            raise ValueError("apply_products reads contiguous float32 rows")
    lib.lora_apply_f32(step, layer, projection, x.data_ptr(), x.shape[1], y.data_ptr(), y.shape[1])
