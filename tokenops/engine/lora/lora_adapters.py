"""LoRA adapters served together on one base model (Punica / S-LoRA style).

An adapter is a PEFT folder (``adapter_config.json`` + ``adapter_model.safetensors``, what
``peft``'s ``save_pretrained`` writes and vLLM loads) for a Llama-family base. Its weights stay
small and in 16/32-bit even when the base is GGUF-quantized: they are never merged into the base.

One engine step may hold rows of the base and of several adapters. Each row (chunk) names its
adapter. Steps the fused native step runs (most steps on CPU) add the adapters' products inside it
(:mod:`tokenops.engine.lora.lora_native`); for the PyTorch forward :class:`LoraSet` turns the rows into
*segments* — for each adapter present in the step, the token rows that use it — and a forward hook
on every targeted projection adds ``scaling * (x[rows] @ A.T) @ B.T`` to those rows only (one pair of
small matmuls per adapter per projection, whatever the number of rows: a segment-grouped product).
Rows with no adapter get nothing added, so the base's output is bit-identical to an engine without
adapters.

Our model fuses q/k/v into ``qkv_proj`` and gate/up into ``gate_up_proj``; an adapter's A
matrices for the fused parts are stacked (one ``x @ A.T`` per fused projection) and each part keeps
its own B, added to its slice of the fused output: the adapter holds exactly its file's matrices
(no block-diagonal zeros).

Loading validates everything before anything changes (:class:`AdapterError`, one message):
missing files, a PEFT type other than LoRA, unsupported options (DoRA, biases, saved modules,
per-layer ranks), a target our model has not, a rank or shape that does not fit the base, and a
base model of another name.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from tokenops.engine.models.args import ModelArgs

#: HF projection name -> (our module under the layer, index of the part in the fused output)
TARGETS: dict[str, tuple[str, int]] = {
    "q_proj": ("self_attn.qkv_proj", 0), "k_proj": ("self_attn.qkv_proj", 1), "v_proj": ("self_attn.qkv_proj", 2),
    "o_proj": ("self_attn.o_proj", 0),
    "gate_proj": ("mlp.gate_up_proj", 0), "up_proj": ("mlp.gate_up_proj", 1), "down_proj": ("mlp.down_proj", 0),
}  # fmt: skip
_KEY = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.\w+)?\.weight$")


class AdapterError(ValueError):
    """The adapter cannot be served on this base (the message says why); nothing was changed."""


@dataclass(frozen=True)
class LoraWeights:
    """One adapter on one of our (possibly fused) projections: the parts' A matrices stacked,
    ``a`` ``[parts * rank, in]``, and per part ``(first output column, (B * scaling).T [rank, out_part])``;
    part ``j`` adds ``(x @ a.T)[:, j * rank:(j + 1) * rank] @ bt`` to its columns. B is held transposed so
    that the fused step's second product runs along output features (no horizontal sums)."""

    a: torch.Tensor
    parts: tuple[tuple[int, torch.Tensor], ...]

    @property
    def nbytes(self) -> int:
        return self.a.numel() * self.a.element_size() + sum(b.numel() * b.element_size() for _, b in self.parts)


@dataclass
class LoraAdapter:
    """One loaded adapter: its :class:`LoraWeights` per ``(layer, our module)``."""

    name: str
    path: Path
    rank: int
    alpha: float
    scaling: float
    base_model: str | None
    targets: tuple[str, ...]
    weights: dict[tuple[int, str], LoraWeights] = field(repr=False, default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Memory the adapter holds: its A and B matrices, as many bytes as the file's (in its dtype)."""
        return sum(w.nbytes for w in self.weights.values())

    @property
    def file_bytes(self) -> int | None:
        """Size of the adapter's safetensors file (what ``bytes`` should be about; None once it is gone)."""
        try:
            return (self.path / "adapter_model.safetensors").stat().st_size
        except OSError:
            return None

    def info(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": str(self.path),
            "rank": self.rank,
            "alpha": self.alpha,
            "targets": list(self.targets),
            "base_model": self.base_model,
            "bytes": self.nbytes,
            "file_bytes": self.file_bytes,
        }


def _part_sizes(args: ModelArgs) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each HF projection of a layer."""
    q, kv = args.num_heads * args.head_dim, args.num_kv_heads * args.head_dim
    h, i = args.hidden_size, args.intermediate_size
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}  # fmt: skip


def _same_base(named: str | None, served: list[str]) -> bool:
    """Whether the adapter's ``base_model_name_or_path`` names the served model: its last path
    component, case-insensitive, contained in one of the served names (or the other way round),
    so ``HuggingFaceTB/SmolLM2-135M-Instruct`` matches a GGUF file ``SmolLM2-135M-Instruct.Q4_1``."""
    if not named:
        return True  # the adapter does not say; the shape checks still apply
    want = Path(named.rstrip("/")).name.lower()
    for name in served:
        have = Path(name.rstrip("/")).name.lower()
        if have and (want in have or have in want):
            return True
    return False


def load_adapter(
    name: str,
    path: str | Path,
    args: ModelArgs,
    served_names: list[str],
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    check_base: bool = True,
) -> LoraAdapter:
    """Read and validate the PEFT folder ``path`` for the base described by ``args``.

    :param served_names: the base's names (served name, folder/file name) to check the adapter's
        ``base_model_name_or_path`` against (skipped with ``check_base=False``).
    :param dtype: float32 or bfloat16, what the adapter's matrices are kept in.
    :raises AdapterError: with the one reason the adapter cannot be served.
    """
    folder = Path(path).expanduser()
    where = f"LoRA adapter {name!r} ({folder})"
    cfg = _read_config(where, folder)
    if args.is_moe:
        raise AdapterError(f"{where}: the base is a mixture-of-experts model; adapters are served on dense bases only")
    base = cfg.get("base_model_name_or_path")
    if check_base and not _same_base(base, served_names):
        raise AdapterError(f"{where}: it was made for base model {base!r}, but this engine serves {served_names[0]!r}")
    rank, alpha = int(cfg.get("r", 0)), float(cfg.get("lora_alpha", cfg.get("r", 0)))
    if rank < 1:
        raise AdapterError(f"{where}: rank r = {cfg.get('r')!r} must be a positive integer")
    scaling = alpha / math.sqrt(rank) if cfg.get("use_rslora") else alpha / rank
    if dtype not in (torch.float32, torch.bfloat16):
        raise AdapterError(f"{where}: adapters are kept in float32 or bfloat16, not {dtype}")
    found = _read_matrices(where, folder / "adapter_model.safetensors", args)
    _check_shapes(where, found, _part_sizes(args), rank)
    weights = _fuse(found, args, rank, scaling, dtype, torch.device(device))
    targets = tuple(sorted({part for _, part in found}, key=list(TARGETS).index))
    return LoraAdapter(name, folder, rank, alpha, scaling, base, targets, weights)


def _read_config(where: str, folder: Path) -> dict[str, Any]:
    """``adapter_config.json`` of a PEFT folder that also holds its weights, refused when it asks for a
    PEFT feature the engine does not apply (serving it anyway would silently give other outputs)."""
    cfg_file, weights_file = folder / "adapter_config.json", folder / "adapter_model.safetensors"
    for f in (cfg_file, weights_file):
        if not f.is_file():
            raise AdapterError(
                f"{where}: missing {f.name} (a PEFT adapter folder holds adapter_config.json "
                "and adapter_model.safetensors)"
            )
    try:
        cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise AdapterError(f"{where}: adapter_config.json is not valid JSON: {e}") from None
    if str(cfg.get("peft_type", "")).upper() != "LORA":
        raise AdapterError(f"{where}: peft_type is {cfg.get('peft_type')!r}; only LORA adapters are served")
    for key, bad in (("use_dora", True), ("fan_in_fan_out", True)):
        if cfg.get(key) == bad:
            raise AdapterError(f"{where}: {key} = {bad} is not supported")
    if cfg.get("bias", "none") != "none":
        raise AdapterError(f"{where}: bias = {cfg['bias']!r} is not supported (only 'none')")
    for key in ("modules_to_save", "rank_pattern", "alpha_pattern", "layers_to_transform"):
        if cfg.get(key):
            raise AdapterError(f"{where}: {key} is not supported (the adapter sets {cfg[key]!r})")
    return cfg


def _read_matrices(where: str, weights_file: Path, args: ModelArgs) -> dict[tuple[int, str], dict[str, torch.Tensor]]:
    """The adapter's matrices by (layer, part) then "A"/"B"; any weight that is not a LoRA matrix of a
    target of a layer the base has is refused, so nothing in the file is silently ignored."""
    from safetensors import safe_open

    found: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    try:
        with safe_open(str(weights_file), framework="pt", device="cpu") as f:
            for key in f.keys():
                m = _KEY.search(key)
                if m is None or m.group(2) not in TARGETS:
                    raise AdapterError(f"{where}: weight {key!r} is not a LoRA matrix of q/k/v/o/gate/up/down_proj")
                layer, part, ab = int(m.group(1)), m.group(2), m.group(3)
                if layer >= args.num_layers:
                    raise AdapterError(f"{where}: {key!r} is for layer {layer}, but the base has {args.num_layers}")
                found.setdefault((layer, part), {})[ab] = f.get_tensor(key)
    except AdapterError:
        raise
    except Exception as e:  # a corrupt safetensors file comes in several error types
        raise AdapterError(f"{where}: cannot read adapter_model.safetensors: {type(e).__name__}: {e}") from None
    if not found:
        raise AdapterError(f"{where}: adapter_model.safetensors holds no LoRA weights")
    return found


def _check_shapes(
    where: str,
    found: dict[tuple[int, str], dict[str, torch.Tensor]],
    sizes: dict[str, tuple[int, int]],
    rank: int,
) -> None:
    """Every (layer, part) has both matrices, shaped for ``rank`` on this base: an adapter made for
    another base of the same family fails here with both shapes named, not in a matmul."""
    for (layer, part), ab in found.items():
        if set(ab) != {"A", "B"}:
            raise AdapterError(f"{where}: layer {layer} {part} has lora_{''.join(ab)} but not both A and B")
        in_f, out_f = sizes[part]
        if tuple(ab["A"].shape) != (rank, in_f) or tuple(ab["B"].shape) != (out_f, rank):
            raise AdapterError(
                f"{where}: layer {layer} {part} has A {tuple(ab['A'].shape)} and B {tuple(ab['B'].shape)}, but rank "
                f"{rank} on this base needs A {(rank, in_f)} and B {(out_f, rank)} (an adapter for another base?)"
            )


def _host(t: torch.Tensor) -> np.ndarray:
    """The tensor as a float32 numpy array (a view when it is one already)."""
    return (t if t.dtype == torch.float32 else t.float()).numpy()


def _fuse(
    found: dict[tuple[int, str], dict[str, torch.Tensor]],
    args: ModelArgs,
    rank: int,
    scaling: float,
    dtype: torch.dtype,
    device: torch.device,
) -> dict[tuple[int, str], LoraWeights]:
    """Per (layer, our fused module): A of its parts stacked, each part's scaled, transposed B with its
    output offset. The arithmetic is numpy's (one thread): torch's ops would each fork its thread pool,
    which a load runs beside the engine's step — on a busy box a thousand small forks took seconds."""
    sizes = _part_sizes(args)
    by_module: dict[tuple[int, str], list[str]] = {}
    for layer, part in found:
        by_module.setdefault((layer, TARGETS[part][0]), []).append(part)
    out: dict[tuple[int, str], LoraWeights] = {}

    def put(arr: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(arr)
        return t if dtype == torch.float32 and device.type == "cpu" else t.to(device=device, dtype=dtype).contiguous()

    for (layer, module), parts in by_module.items():
        parts.sort(key=lambda p: TARGETS[p][1])
        members = [p for p in TARGETS if TARGETS[p][0] == module]
        offsets, start = {}, 0
        for p in members:
            offsets[p] = start
            start += sizes[p][1]
        a = np.concatenate([_host(found[(layer, p)]["A"]) for p in parts])
        bs = tuple(
            (offsets[p], put(np.multiply(_host(found[(layer, p)]["B"]).T, np.float32(scaling), order="C")))
            for p in parts
        )
        out[(layer, module)] = LoraWeights(put(a), bs)
    return out


class _Segments:
    """The step's rows per adapter slot: ``[(adapter, rows or None for every row)]``."""

    def __init__(self) -> None:
        self.groups: list[tuple[LoraAdapter, torch.Tensor | None]] = []


class LoraSet:
    """The adapters loaded on one model and the forward hooks that add their products.

    The runner calls :meth:`begin_step` with each token row's adapter name (None: the base) before
    the forward and :meth:`end_step` after; hooks are installed on the targeted projections only
    while at least one adapter is loaded, so a base-only engine pays nothing."""

    def __init__(self, model: nn.Module, args: ModelArgs) -> None:
        self.model = model
        self.args = args
        self.adapters: dict[str, LoraAdapter] = {}
        self._segments = _Segments()
        self._hooks: list[Any] = []
        #: steps that held at least one adapter row, and how many of them ran as the fused native step
        self.num_steps = 0
        self.num_fused_steps = 0

    def __contains__(self, name: object) -> bool:
        return name in self.adapters

    def add(self, adapter: LoraAdapter) -> None:
        if adapter.name in self.adapters:
            raise AdapterError(f"LoRA adapter {adapter.name!r} is already loaded")
        self.adapters[adapter.name] = adapter
        self._install()

    def remove(self, name: str) -> LoraAdapter:
        adapter = self.adapters.pop(name)
        self._install()
        return adapter

    def _install(self) -> None:
        """(Re)hook the modules some loaded adapter targets."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        modules = {key for a in self.adapters.values() for key in a.weights}
        stack = self.model.model
        assert isinstance(stack, nn.Module)  # a CausalLM (tokenops/engine/models/llama.py): .model holds the layers
        layers = stack.layers
        assert isinstance(layers, nn.ModuleList)
        for layer, module in sorted(modules):
            target = layers[layer].get_submodule(module)
            self._hooks.append(target.register_forward_hook(self._hook(layer, module)))

    def _hook(self, layer: int, module: str):
        key = (layer, module)
        segments = self._segments

        def add_lora(_mod: nn.Module, inputs: tuple[torch.Tensor, ...], y: torch.Tensor) -> torch.Tensor:
            if not segments.groups:
                return y
            x = inputs[0]
            for adapter, rows in segments.groups:
                w = adapter.weights.get(key)
                if w is None:
                    continue
                xs = x if rows is None else x.index_select(0, rows)
                t = xs.to(w.a.dtype) @ w.a.T
                delta = torch.zeros(xs.shape[0], y.shape[-1], dtype=w.a.dtype, device=y.device)
                for j, (off, bt) in enumerate(w.parts):
                    r = bt.shape[0]
                    delta[:, off : off + bt.shape[1]] = t[:, j * r : (j + 1) * r] @ bt
                y = y + delta.to(y.dtype) if rows is None else y.index_add(0, rows, delta.to(y.dtype))
            return y

        return add_lora

    def count_step(self, row_adapters: list[str | None], fused: bool) -> set[str]:
        """Check that the step's adapters are loaded and count the step; returns their names."""
        names = {n for n in row_adapters if n is not None}
        unknown = names - set(self.adapters)
        if unknown:
            raise AdapterError(f"LoRA adapter {sorted(unknown)[0]!r} is not loaded")
        if names:
            self.num_steps += 1
            self.num_fused_steps += fused
        return names

    def begin_step(self, row_adapters: list[str | None], device: torch.device) -> bool:
        """Group the step's token rows by adapter for the PyTorch forward's hooks; True when any row uses one."""
        names = self.count_step(row_adapters, fused=False)
        if not names:
            self._segments.groups = []
            return False
        groups: list[tuple[LoraAdapter, torch.Tensor | None]] = []
        for name in sorted(names):
            rows = [i for i, n in enumerate(row_adapters) if n == name]
            whole = len(rows) == len(row_adapters)
            groups.append((self.adapters[name], None if whole else torch.tensor(rows, dtype=torch.long, device=device)))
        self._segments.groups = groups
        return True

    def end_step(self) -> None:
        self._segments.groups = []

    def stats(self) -> dict[str, Any]:
        return {
            "adapters": [a.info() for a in self.adapters.values()],
            "steps": self.num_steps,
            "fused_steps": self.num_fused_steps,
        }
