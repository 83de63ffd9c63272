"""``[lora]``: the folders ``POST /admin/lora`` may load adapters from (tokenops/gateway/admin/lora_roots.py,
docs/lora.md). Declared apart from :mod:`tokenops.config` (which loads it)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass(slots=True)
class LoraSettings:
    """None configured: the store folder's ``adapters/`` and the shipped demo adapters. Adapters given
    at start (``[[models]] lora``, ``--lora``) may sit anywhere."""

    roots: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if isinstance(self.roots, str):  # TOKENOPS_LORA__ROOTS: folders separated by os.pathsep
            self.roots = [r for r in self.roots.split(os.pathsep) if r]
        if not isinstance(self.roots, list) or not all(isinstance(r, str) and r for r in self.roots):
            # a TypeError: tokenops.config reports it as a ConfigError naming the section
            raise TypeError(f'roots must be a list of folders, e.g. roots = ["/srv/adapters"], not {self.roots!r}')
