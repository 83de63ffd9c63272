"""The tensor side of the KV offload tier: host slots (and disk files) holding evicted blocks.

:class:`~tokenops.engine.kv.offload_index.OffloadIndex` decides what goes where; this
class executes its ops against the runner's KV cache, one block at a time, in order.
The host tier is one preallocated tensor of ``num_host_slots`` blocks (pinned when the
pool is on a GPU, so the copies can run without a staging buffer); the disk tier is a
folder of one ``.pt`` file per block, named by the block hash.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import weakref
from pathlib import Path

import torch

from tokenops.engine.kv.offload_index import TransferOp


def block_bytes(kv_cache: torch.Tensor, kv_scales: torch.Tensor | None) -> int:
    """Bytes of one KV block (every layer, K and V, plus int8 scales)."""
    num = kv_cache[:, :, 0].numel() * kv_cache.element_size()
    if kv_scales is not None:
        num += kv_scales[:, :, 0].numel() * kv_scales.element_size()
    return num


class OffloadStore:
    """Host (and disk) copies of KV blocks of ``kv_cache`` ``[2, layers, blocks, ...]``."""

    def __init__(
        self,
        kv_cache: torch.Tensor,
        kv_scales: torch.Tensor | None,
        num_host_slots: int,
        num_disk_blocks: int = 0,
        disk_path: str | None = None,
    ) -> None:
        assert num_host_slots > 0 and num_disk_blocks >= 0
        self.kv_cache = kv_cache
        self.kv_scales = kv_scales
        self.num_host_slots = num_host_slots
        self.num_disk_blocks = num_disk_blocks
        is_pinned = kv_cache.device.type == "cuda"
        shape = (num_host_slots, *kv_cache[:, :, 0].shape)
        self.host = torch.empty(shape, dtype=kv_cache.dtype, pin_memory=is_pinned)
        self.host_scales = (
            None
            if kv_scales is None
            else torch.empty((num_host_slots, *kv_scales[:, :, 0].shape), dtype=kv_scales.dtype, pin_memory=is_pinned)
        )
        self.disk_dir: Path | None = None
        if num_disk_blocks:
            if disk_path:
                self.disk_dir = Path(disk_path).expanduser()
                self.disk_dir.mkdir(parents=True, exist_ok=True)
                for old in self.disk_dir.glob("kv-*.pt"):  # the index starts empty: stale files would leak
                    old.unlink()
            else:
                self.disk_dir = Path(tempfile.mkdtemp(prefix="tokenops-kv-"))
                weakref.finalize(self, shutil.rmtree, self.disk_dir, ignore_errors=True)
        self.num_transfers = 0
        self.transfer_time_s = 0.0

    @property
    def host_bytes(self) -> int:
        num = self.host.numel() * self.host.element_size()
        if self.host_scales is not None:
            num += self.host_scales.numel() * self.host_scales.element_size()
        return num

    @torch.inference_mode()
    def execute(self, ops: list[TransferOp]) -> None:
        """Run the index's ops in order (see :mod:`tokenops.engine.kv.offload_index`)."""
        start = time.perf_counter()
        cache, scales = self.kv_cache, self.kv_scales
        for op in ops:
            kind = op[0]
            if kind == "save":
                _, block_id, slot = op
                self.host[slot].copy_(cache[:, :, block_id])
                if scales is not None:
                    assert self.host_scales is not None  # allocated whenever the cache has scales
                    self.host_scales[slot].copy_(scales[:, :, block_id])
            elif kind == "load":
                _, slot, block_id = op
                cache[:, :, block_id].copy_(self.host[slot], non_blocking=True)
                if scales is not None:
                    assert self.host_scales is not None  # allocated whenever the cache has scales
                    scales[:, :, block_id].copy_(self.host_scales[slot], non_blocking=True)
            elif kind == "spill":
                _, slot, key = op
                data = {"kv": self.host[slot].clone()}
                if self.host_scales is not None:
                    data["scales"] = self.host_scales[slot].clone()
                torch.save(data, self._path(key))
            elif kind == "load_disk":
                _, key, block_id = op
                data = torch.load(self._path(key), map_location="cpu", weights_only=True)
                cache[:, :, block_id].copy_(data["kv"])
                if scales is not None:
                    scales[:, :, block_id].copy_(data["scales"])
            elif kind == "drop_disk":
                self._path(op[1]).unlink(missing_ok=True)
            else:
                raise AssertionError(f"unknown KV transfer {op!r}")
        if ops and cache.device.type == "cuda":
            torch.cuda.current_stream(cache.device).synchronize()  # host slots may be reused next step
        self.num_transfers += len(ops)
        self.transfer_time_s += time.perf_counter() - start

    def _path(self, key: int) -> Path:
        assert self.disk_dir is not None, "disk tier op without a disk tier"
        return self.disk_dir / f"kv-{key & 0xFFFFFFFFFFFFFFFF:016x}.pt"
