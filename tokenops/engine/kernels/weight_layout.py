"""CPU weight layout: the model's linear layers through packed weights.

With the fused decode step on (:mod:`tokenops.engine.kernels.fused_decode`), ``"auto"`` (and
``"panels"``) makes every linear layer multiply through the copy of its weight that step packs
in 16-wide panels, and releases the dense weight: one copy of the weights, and steps too large for
the fused step use the same products. Otherwise, the layers go through oneDNN with prepacked weights:

On CPU, ``F.linear`` hands ``x @ W.T`` to a BLAS GEMM that re-reads the weight in its
plain row-major layout every call. oneDNN (PyTorch's ``mkldnn`` backend, the path that
``torch.compile`` takes on CPU when it freezes weights) can instead reorder each weight
once, at load, into the blocked layout its GEMM kernels stream from. On this project's
2-core AVX2 box that made the 32M benchmark Llama's matmuls 1.3-1.6x faster at every
batch size that matters (1, 16 and 48 rows; ``docs/engine-optimizations.md``).

:func:`pack_linear_weights` converts every :class:`tokenops.engine.models.layers.Linear`
of a float32 model on CPU whose weight has at least :data:`MIN_PACKED_ELEMENTS` elements
(smaller ones stay on ``F.linear``, cheaper per call; ``"onednn"`` packs them all). A layer
that a transform plugin replaced (quantized layers) is left alone. The dense weight of a
packed layer is released (it would double the memory) unless it is shared, e.g. a lm_head
tied to the embeddings: ``"auto"`` packs such a layer alongside only while the copy is at
most :data:`MAX_SHARED_COPY_BYTES`, ``"onednn"`` always does. Results match ``F.linear`` to
float32 rounding (about 1e-6 relative), and the HF greedy-parity tests run through this path.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

log = logging.getLogger(__name__)

LAYOUTS = ("auto", "panels", "onednn", "plain")
#: Smallest weight (elements) packed: a oneDNN call has a fixed cost of ~20 us against ~4 us for
#: F.linear, which only pays off on weights this size and up (measured at 1 and 2 threads).
MIN_PACKED_ELEMENTS = 1 << 18
#: Largest shared weight (bytes) ``auto`` packs: a tied lm_head keeps its dense tensor for the
#: embedding, so packing it adds a copy. Small models gain (the demo target's verify steps of
#: speculative decoding run 1.37x -> 1.48x faster than plain decoding with it packed); a large
#: vocabulary (e.g. 152k x 896 = 544 MB) would pay too much memory.
MAX_SHARED_COPY_BYTES = 64 << 20


def onednn_available() -> bool:
    """Whether this torch build has the oneDNN linear ops (CPU builds for x86/ARM do)."""
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


def pack_linear_weights(
    model: nn.Module, device: torch.device, dtype: torch.dtype, layout: str = "auto", panels=None
) -> str:
    """Pack ``model``'s linear layers; returns the layout used ("panels", "onednn" or "plain").

    ``panels`` is the runner's fused decode step (:class:`tokenops.engine.kernels.fused_decode.FusedDecoder`)
    or None: with one, ``"auto"`` and ``"panels"`` make the linear layers multiply through the
    copy of their weights it already holds (its 16-wide panels; the dense weights are released, so
    they are held once). Otherwise ``"auto"`` packs for oneDNN when it can. ``"panels"`` and
    ``"onednn"`` raise when they cannot be used."""
    from tokenops.engine.models.layers import Linear

    if layout not in LAYOUTS:
        raise ValueError(f"engine weight_layout must be one of {', '.join(LAYOUTS)}, not {layout!r}")
    if layout == "plain":
        return "plain"
    if layout in ("auto", "panels") and panels is not None:
        num = panels.attach_linear_layers(model)
        log.debug("%d linear layers multiply through the fused decode step's panels", num)
        return "panels"
    if layout == "panels":
        raise ValueError(
            "engine weight_layout 'panels' is unavailable: it needs the fused decode step "
            "(decode_kernel 'auto' or 'native', on a model it accepts, without a compiled forward)"
        )
    why = None
    if device.type != "cpu":
        why = "it is for CPU"
    elif dtype != torch.float32:
        why = "it is used for float32 weights only (bf16/fp16 GEMMs need AVX-512 BF16/AMX to gain)"
    elif not onednn_available():
        why = "this torch build has no oneDNN"
    if why is not None:
        if layout == "onednn":
            raise ValueError(f"engine weight_layout 'onednn' is unavailable: {why}")
        return "plain"
    shared = shared_param_ids(model)
    num = 0
    with torch.no_grad():
        for module in model.modules():
            if type(module) is not Linear or module.weight.dtype != torch.float32 or module.packed is not None:
                continue
            is_shared = id(module.weight) in shared
            # auto: large weights only; a shared one only while its packed copy stays small
            copy_bytes = module.weight.numel() * module.weight.element_size()
            if layout == "onednn" or (
                module.weight.numel() >= MIN_PACKED_ELEMENTS and (not is_shared or copy_bytes <= MAX_SHARED_COPY_BYTES)
            ):
                module.pack(release=not is_shared)
                num += 1
    log.debug("packed %d linear layers for oneDNN", num)
    return "onednn" if num else "plain"


def shared_param_ids(model: nn.Module) -> set[int]:
    """ids of the parameters that modules other than linear layers hold (a lm_head tied to the
    embeddings): a layer that packs such a weight must keep the dense tensor."""
    from tokenops.engine.models.layers import Linear

    return {id(p) for m in model.modules() if not isinstance(m, Linear) for p in m.parameters(recurse=False)}


def packed_bytes(model: nn.Module) -> int:
    """Bytes held by packed weights (they are not parameters or buffers)."""
    from tokenops.engine.models.layers import Linear

    return sum(
        m.packed.numel() * m.packed.element_size()
        for m in model.modules()
        if isinstance(m, Linear) and m.packed is not None
    )
