"""The sparse layers of a GGUF mixture-of-experts model, with the experts kept in the file's encoding.

llama.cpp writes a sparse layer's router as ``blk.N.ffn_gate_inp`` (``[E] <- [H]``), the experts
stacked along a third axis in ``ffn_gate_exps`` / ``ffn_up_exps`` (``[E, I, H]``) and
``ffn_down_exps`` (``[E, H, I]``) (Mixtral files from before April 2024: one tensor per expert,
``ffn_gate.E``...), and Qwen2-MoE's shared expert as ``ffn_{gate,up,down}_shexp`` with its
sigmoid gate ``ffn_gate_inp_shexp``. Each expert becomes two :class:`QuantizedLinear` over its
rows of those tensors, copied once from the file mapping and packed for the native kernels with
the rest of the model (so the experts' resident memory is their size in the file).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from tokenops.engine.gguf.gguf_reader import GGUFError, GGUFFile
from tokenops.engine.kernels.quantized_linear import QuantizedLinear, QuantizedWeight
from tokenops.engine.models.moe import ExpertLayers, SparseMoeBlock

#: ``stack(names, rows)``: the tensors ``names`` (rows ``rows[i]`` of each) as quantized weights
#: stacked along their outputs (``gguf_weights._stacked`` on the open file)
Stack = Callable[[list[str], list[slice]], list[QuantizedWeight]]
_ALL = slice(None)


def attach_experts(block: SparseMoeBlock, file: GGUFFile, layer: int, stack: Stack) -> None:
    """Fill ``block`` (layer ``layer``'s sparse MLP) from ``file``: router, experts, shared expert.

    :raises GGUFError: for a missing tensor or one whose shape differs from the metadata's.
    """
    p = f"blk.{layer}."
    hidden, num_experts = block.gate.in_features, block.num_experts
    inter = block.w_gate_up.shape[1] // 2

    def linear(names: list[str], rows: list[slice], out_features: int, in_features: int) -> QuantizedLinear:
        made = QuantizedLinear(stack(names, rows))
        if (made.out_features, made.in_features) != (out_features, in_features):
            raise GGUFError(
                f"GGUF {' and '.join(names)}: shape {(made.out_features, made.in_features)} "
                f"does not match the metadata's {(out_features, in_features)}"
            )
        return made

    block.gate = linear([p + "ffn_gate_inp.weight"], [_ALL], num_experts, hidden)  # type: ignore[assignment]
    gate_up: list[nn.Module] = []
    down: list[nn.Module] = []
    for e in range(num_experts):
        (gate, gate_rows), (up, up_rows) = (
            _expert_rows(file, p, part, e, inter, num_experts) for part in ("gate", "up")
        )
        gate_up.append(linear([gate, up], [gate_rows, up_rows], 2 * inter, hidden))
        name, rows = _expert_rows(file, p, "down", e, hidden, num_experts)
        down.append(linear([name], [rows], hidden, inter))
    block.set_experts(ExpertLayers(gate_up, down))
    shared = block.shared_expert
    if shared is not None:
        width = shared.gate_up_proj.out_features // 2
        names = [p + "ffn_gate_shexp.weight", p + "ffn_up_shexp.weight"]
        shared.gate_up_proj = linear(names, [_ALL, _ALL], 2 * width, hidden)  # type: ignore[assignment]
        shared.down_proj = linear([p + "ffn_down_shexp.weight"], [_ALL], hidden, width)  # type: ignore[assignment]
        # ggml [H] (or [H, 1]): one row either way
        block.shared_expert_gate = linear([p + "ffn_gate_inp_shexp.weight"], [_ALL], 1, hidden)  # type: ignore[assignment]
    elif file.has_tensor(p + "ffn_gate_shexp.weight"):
        raise GGUFError(f"GGUF layer {layer} has a shared expert, which its metadata does not describe")


def _expert_rows(file: GGUFFile, p: str, part: str, expert: int, rows: int, num_experts: int) -> tuple[str, slice]:
    """Where expert ``expert``'s ``ffn_{part}`` weight lies: its ``rows`` rows of the stacked
    tensor, or the whole of an older file's per-expert tensor."""
    stacked = f"{p}ffn_{part}_exps.weight"
    if file.has_tensor(stacked):
        shape = file.tensors[stacked].shape
        if len(shape) != 3 or shape[2] != num_experts or shape[1] != rows:
            raise GGUFError(f"GGUF tensor {stacked!r} has shape {shape}; expected [*, {rows}, {num_experts}]")
        return stacked, slice(expert * rows, (expert + 1) * rows)
    single = f"{p}ffn_{part}.{expert}.weight"
    if file.has_tensor(single):
        return single, _ALL
    raise GGUFError(f"GGUF file lacks tensor {stacked!r}")
