"""``[batches]``: the Batch API's bounds and policy (docs/batches.md). Declared apart from
:mod:`tokenops.config` (which loads it) so the runner's knobs sit in one short place."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class BatchSettings:
    """Upload bounds, the runner's share of the engine, and the price of batch tokens."""

    max_file_bytes: int = 209_715_200  # an uploaded JSONL file (OpenAI's bound: 200 MB)
    max_lines: int = 50_000  # lines of one input file (OpenAI's bound)
    max_in_flight: int = 8  # batch lines running at once, all batches together
    discount: float = 0.5  # batch tokens cost this share of the model's price
    max_files_per_tenant: int = 10_000  # stored files of one tenant (uploads past it: 400)
    #: upstream engines: the interactive time to first token batch lines are metered to keep under
    #: (tokenops/backends/openai_http_meter.py; live as batches.upstream_ttft_slo_ms; 0: off)
    upstream_ttft_slo_ms: float = 0.0

    def __post_init__(self) -> None:
        # TypeError: what tokenops.config turns into a ConfigError naming the section and file
        for name in ("max_file_bytes", "max_lines", "max_in_flight", "max_files_per_tenant"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise TypeError(f"{name}: expected an integer >= 1, got {value!r}")
        discount = self.discount
        if isinstance(discount, bool) or not isinstance(discount, (int, float)) or not 0.0 <= discount <= 1.0:
            raise TypeError(f"discount: expected a share of the price in [0, 1], got {discount!r}")
        slo = self.upstream_ttft_slo_ms
        if isinstance(slo, bool) or not isinstance(slo, (int, float)) or not 0.0 <= slo <= 3_600_000:
            raise TypeError(f"upstream_ttft_slo_ms: expected milliseconds in [0, 3600000] (0: off), got {slo!r}")
