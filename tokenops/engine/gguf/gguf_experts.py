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
    hidden = block.gate.in_features
    inter = block.w_gate_up.shape[1] // 2
    block.gate = _checked(
        QuantizedLinear(stack([p + "ffn_gate_inp.weight"], [_ALL])), block.num_experts, hidden, p + "ffn_gate_inp"
    )  # type: ignore[assignment]
    gate_up, down = [], []
    for e in range(block.num_experts):
        (gate, gate_rows), (up, up_rows) = (
            _expert_rows(file, p, part, e, inter, block.num_experts) for part in ("gate", "up")
        )
        gate_up.append(
            _checked(
                QuantizedLinear(stack([gate, up], [gate_rows, up_rows])),
                2 * inter,
                hidden,
                f"{gate} and {up[len(p) :]} expert {e}",
            )
        )
        name, rows = _expert_rows(file, p, "down", e, hidden, block.num_experts)
        down.append(_checked(QuantizedLinear(stack([name], [rows])), hidden, inter, f"{name} expert {e}"))
    block.set_experts(ExpertLayers(gate_up, down))
    if block.shared_expert is not None:
        shared = block.shared_expert
        width = shared.gate_up_proj.out_features // 2
        names = [p + "ffn_gate_shexp.weight", p + "ffn_up_shexp.weight"]
        shared.gate_up_proj = _checked(
            QuantizedLinear(stack(names, [_ALL, _ALL])), 2 * width, hidden, " and ".join(names)
        )  # type: ignore[assignment]
        shared.down_proj = _checked(
            QuantizedLinear(stack([p + "ffn_down_shexp.weight"], [_ALL])), hidden, width, p + "ffn_down_shexp"
        )  # type: ignore[assignment]
        gate = QuantizedLinear(stack([p + "ffn_gate_inp_shexp.weight"], [_ALL]))  # ggml [H] or [H, 1]: one row
        block.shared_expert_gate = _checked(gate, 1, hidden, p + "ffn_gate_inp_shexp")  # type: ignore[assignment]
    elif file.has_tensor(p + "ffn_gate_shexp.weight"):
        raise GGUFError(f"GGUF layer {layer} has a shared expert, which the {block.num_experts}-expert model lacks")


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


def _checked(linear: QuantizedLinear, out_features: int, in_features: int, what: str) -> nn.Module:
    if (linear.out_features, linear.in_features) != (out_features, in_features):
        raise GGUFError(
            f"GGUF {what}: shape {(linear.out_features, linear.in_features)} "
            f"does not match the metadata's {(out_features, in_features)}"
        )
    return linear
