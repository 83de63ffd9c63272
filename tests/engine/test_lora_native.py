"""The fused step's tiled LoRA products (tokenops/engine/csrc/lora.c) against plain torch.

Rows of several adapters and of the base, in any order, grouped into tiles of one adapter by
:class:`NativeLora`: every adapter row must get ``x @ A.T @ B.T * scale`` on its adapter's columns
and every base row nothing. Shapes are chosen to reach each path of the C products: a group of
one row, groups longer than a tile, ranks 16, 8 and 5 (a rank not a multiple of four), widths that
leave a tail under one vector and blocks of four vectors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tokenops.engine.core.batch import ChunkInput
from tokenops.engine.kernels import fused_library
from tokenops.engine.kernels.c_header import CSRC
from tokenops.engine.lora.lora_adapters import LoraAdapter, LoraWeights
from tokenops.engine.lora.lora_native import TILE, NativeLora, apply_products, tiles

K = 52  # input features: not a multiple of 8 or 16 (the scalar tail of x A^T)
#: the q/k/v parts' output columns (first column, width): 100 = a block of 64 + two of 16 + a tail of 4
PARTS = ((0, 100), (100, 24), (124, 7))
N = 131
DOWN_IN, DOWN_OUT = 40, 72


#: (adapter, layer, module) -> the plain matrices, per part: (first column, A [rank, in], B [out, rank])
PLAIN: dict[tuple[str, int, str], list[tuple[int, torch.Tensor, torch.Tensor]]] = {}


def _weights(
    key: tuple[str, int, str], parts: list[tuple[int, int]], k: int, rank: int, scaling: float, g
) -> LoraWeights:
    """peft's A [rank, in] and B [out, rank] per part, kept in PLAIN, turned into the engine's layout."""
    plain = [(off, torch.randn(rank, k, generator=g), torch.randn(n, rank, generator=g)) for off, n in parts]
    PLAIN[key] = plain
    stacked = torch.cat([a for _, a, _ in plain])
    return LoraWeights(stacked, tuple((off, (b * scaling).T.contiguous()) for off, _, b in plain))


def _adapter(name: str, rank: int, scaling: float, parts: tuple[int, ...], seed: int) -> LoraAdapter:
    """Random A and B on q/k/v (the given parts) of layer 0 and on down_proj of layer 1."""
    g = torch.Generator().manual_seed(seed)
    qkv = _weights((name, 0, "self_attn.qkv_proj"), [PARTS[j] for j in parts], K, rank, scaling, g)
    down = _weights((name, 1, "mlp.down_proj"), [(0, DOWN_OUT)], DOWN_IN, rank, scaling, g)
    weights = {(0, "self_attn.qkv_proj"): qkv, (1, "mlp.down_proj"): down}
    return LoraAdapter(name, Path("/nonexistent"), rank, 2.0 * rank, scaling, None, (), weights)


def _expected(x: torch.Tensor, y: torch.Tensor, names: list, adapters: dict, key: tuple) -> torch.Tensor:
    """Plain torch in float64, row by row: y + x @ A.T @ B.T * scale on each part's columns of an adapter row."""
    out = y.clone().double()
    for m, name in enumerate(names):
        if name is None:
            continue
        for off, a, b in PLAIN[(name, *key)]:
            out[m, off : off + b.shape[0]] += x[m].double() @ a.double().T @ b.double().T * adapters[name].scaling
    return out.float()


@pytest.fixture(scope="module")
def lib():
    lib = fused_library.library("float32")
    if lib is None:
        pytest.skip("the fused step's C library does not build here")
    return lib


def test_tiles_group_rows_by_adapter():
    # the C loops hold a tile's rows in TK_LORA_TILE slots: Python reads it from the header
    assert f"#define TK_LORA_TILE {TILE} " in (CSRC / "fused_decode.h").read_text()
    tile, rows = tiles([0, -1, 0, 1, 0, 0, 0, -1])
    assert sorted(rows) == list(range(8))
    groups = [rows[tile[i] : tile[i + 1]] for i in range(len(tile) - 1)]
    assert all(0 < len(g) <= TILE for g in groups)
    assert groups == [[0, 2, 4, 5], [6], [1, 7], [3]]


def test_tiled_products_match_torch_on_mixed_rows(lib):
    adapters = {
        "r16": _adapter("r16", 16, 0.5, (0, 1, 2), 1),
        "r8": _adapter("r8", 8, 2.0, (0, 2), 2),  # no k part
        "r5": _adapter("r5", 5, 1.0, (1,), 3),
    }
    # chunks in mixed order: a prefill of 6 rows on r16 (a tile and a half), one-row groups (r5),
    # base rows between adapter rows
    spec = [("r16", 6), (None, 1), ("r8", 1), ("r5", 1), ("r16", 1), (None, 3), ("r8", 2), ("r16", 1)]
    chunks = [ChunkInput(list(range(n)), 0, [0], lora=name) for name, n in spec]
    names = [name for name, n in spec for _ in range(n)]
    native = NativeLora(num_layers=2)
    step = native.step(chunks, adapters)
    g = torch.Generator().manual_seed(0)
    for layer, projection, key, k, n in (
        (0, 0, "self_attn.qkv_proj", K, N),
        (1, 3, "mlp.down_proj", DOWN_IN, DOWN_OUT),
    ):
        x = torch.randn(len(names), k, generator=g)
        y = torch.randn(len(names), n, generator=g)
        want = _expected(x, y, names, adapters, (layer, key))
        base = [m for m, name in enumerate(names) if name is None]
        apply_products(lib, step, layer, projection, x, y)
        torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-4)
        assert torch.equal(y[base], want[base])  # base rows untouched
