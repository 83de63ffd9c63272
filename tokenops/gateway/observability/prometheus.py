"""Prometheus ``/metrics`` in the text exposition format (0.0.4), with vLLM's metric
names under the ``tokenops:`` prefix, labelled ``model_name``.

Written by hand (it is small) so the gateway does not need ``prometheus_client``.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable
from typing import Any

from tokenops.gateway.observability.records import RequestRecord
from tokenops.prometheus_text import PREFIX
from tokenops.prometheus_text import label as _label
from tokenops.prometheus_text import number as _num

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
E2E_BUCKETS = (
    0.01,
    0.05,
    0.1,
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)


class Histogram:
    __slots__ = ("buckets", "counts", "sum", "count")

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str, labels: str) -> Iterable[str]:
        cumulative = 0
        for bound, n in zip(self.buckets, self.counts):
            cumulative += n
            yield f'{name}_bucket{{{labels},le="{bound}"}} {cumulative}'
        yield f'{name}_bucket{{{labels},le="+Inf"}} {self.count}'
        yield f"{name}_sum{{{labels}}} {self.sum}"
        yield f"{name}_count{{{labels}}} {self.count}"


TPOT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
#: 1-2-5 steps, as vLLM builds its token-count buckets up to the model length.
TOKEN_BUCKETS = tuple(float(m * 10**e) for e in range(6) for m in (1, 2, 5))

_HISTOGRAMS = {
    "time_to_first_token_seconds": ("Histogram of time to first token in seconds.", TTFT_BUCKETS),
    "inter_token_latency_seconds": ("Histogram of inter-token latency in seconds.", ITL_BUCKETS),
    "e2e_request_latency_seconds": ("Histogram of end to end request latency in seconds.", E2E_BUCKETS),
    "time_per_output_token_seconds": ("Histogram of time per output token in seconds.", TPOT_BUCKETS),
    # the next three need an engine that reports scheduling (the bundled one does; upstreams do not)
    "request_queue_time_seconds": ("Histogram of time spent in WAITING phase for request.", E2E_BUCKETS),
    "request_prefill_time_seconds": ("Histogram of time spent in PREFILL phase for request.", E2E_BUCKETS),
    "request_decode_time_seconds": ("Histogram of time spent in DECODE phase for request.", E2E_BUCKETS),
    "request_prompt_tokens": ("Number of prefill tokens processed.", TOKEN_BUCKETS),
    "request_generation_tokens": ("Number of generation tokens processed.", TOKEN_BUCKETS),
}
_COUNTERS = {
    "prompt_tokens_total": "Number of prefill tokens processed.",
    "generation_tokens_total": "Number of generation tokens processed.",
    "reasoning_tokens_total": "Of the generation tokens, those spent thinking (reasoning models).",
    "request_failure_total": "Count of failed requests (5xx: the server's or an upstream's failure).",
    "request_rejected_total": "Count of rejected requests (4xx: admission, auth, validation).",
    "request_disconnected_total": "Count of requests whose client went away (499); not failures.",
}
_ENGINE_GAUGES = {
    "num_requests_running": ("num_running", "Number of requests in model execution batches."),
    "num_requests_waiting": (
        "num_waiting",
        "Number of requests waiting to be processed (in the engine's queue or the gateway's admission queue).",
    ),
    "kv_cache_usage_perc": ("kv_cache_usage", "KV-cache usage. 1 means 100 percent usage."),
    # priority classes: of the two above, the batch work (Batch API lines)
    "num_batch_requests_running": ("num_running_batch", "Of the running requests, the batch-class ones."),
    "num_batch_requests_waiting": ("num_waiting_batch", "Of the waiting requests, the batch-class ones."),
}
_ENGINE_COUNTERS = {
    "prefix_cache_queries_total": (
        "prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
    ),
    "prefix_cache_hits_total": ("prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."),
    "num_preemptions_total": ("num_preemptions", "Cumulative number of preemptions from the engine."),
    "num_batch_preemptions_total": (
        "num_batch_preemptions",
        "Of the preemptions, those of batch-class requests (most to make room for interactive ones).",
    ),
    "engine_busy_seconds_total": ("busy_s", "Seconds the engine spent computing steps."),
    "engine_interactive_busy_seconds_total": (
        "interactive_busy_s",
        "Of those, the seconds in steps with interactive (non-batch) requests in them.",
    ),
    # speculative decoding (engines with speculative set; nested under stats["spec_decode"])
    "spec_decode_num_drafts_total": ("spec_decode.num_drafts", "Number of spec decoding drafts."),
    "spec_decode_num_draft_tokens_total": ("spec_decode.num_draft_tokens", "Number of draft tokens."),
    "spec_decode_num_accepted_tokens_total": ("spec_decode.num_accepted_tokens", "Number of accepted tokens."),
    # KV offload tier (engines with it on; nested under stats["kv_offload"])
    "kv_offload_hits_total": (
        "kv_offload.hit_tokens",
        "Prompt tokens loaded back from the KV offload tier instead of recomputed.",
    ),
    "kv_offload_saved_blocks_total": ("kv_offload.saved_blocks", "KV blocks copied to the offload tier on eviction."),
}


def _stat(stats: dict[str, Any] | None, key: str) -> Any:
    """``stats[key]``, following dots into nested dicts (None when absent)."""
    value: Any = stats
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


class PrometheusMetrics:
    """Request histograms and counters per model; engine gauges read at scrape time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hist: dict[str, dict[str, Histogram]] = {name: {} for name in _HISTOGRAMS}
        self._counters: dict[str, dict[str, float]] = {name: {} for name in _COUNTERS}
        #: successes per (model, finished_reason), vLLM's request_success_total labels
        self._success: dict[tuple[str, str], int] = {}
        #: Callables yielding more exposition lines (e.g. spend and budgets), appended at render time.
        self.sections: list[Any] = []

    def observe(self, rec: RequestRecord) -> None:
        model = rec.model_served or rec.model_requested
        with self._lock:
            if rec.is_ok:
                key = (model, rec.finish_reason or "stop")
                self._success[key] = self._success.get(key, 0) + 1
                self._observe_phases(rec, model)
                self._count("prompt_tokens_total", model, rec.tokens_in)
                self._count("generation_tokens_total", model, rec.tokens_out)
                if rec.reasoning_tokens is not None:
                    self._count("reasoning_tokens_total", model, rec.reasoning_tokens)
                if rec.ttft_s is not None:
                    self._histogram("time_to_first_token_seconds", model).observe(rec.ttft_s)
                if rec.e2e_s is not None:
                    self._histogram("e2e_request_latency_seconds", model).observe(rec.e2e_s)
                itl = self._histogram("inter_token_latency_seconds", model)
                for gap in rec.itl:
                    itl.observe(gap)
            else:  # one definition of an error (RequestRecord.outcome)
                self._count(
                    {
                        "error": "request_failure_total",
                        "rejected": "request_rejected_total",
                        "disconnected": "request_disconnected_total",
                    }[rec.outcome],
                    model,
                    1,
                )

    def _observe_phases(self, rec: RequestRecord, model: str) -> None:
        """TPOT, token counts, and queue/prefill/decode times where the engine reported them."""
        self._histogram("request_prompt_tokens", model).observe(rec.tokens_in)
        self._histogram("request_generation_tokens", model).observe(rec.tokens_out)
        if rec.tpot_s is not None:
            self._histogram("time_per_output_token_seconds", model).observe(rec.tpot_s)
        if rec.queue_s is not None:
            self._histogram("request_queue_time_seconds", model).observe(rec.queue_s)
        if rec.prefill_s is not None:
            self._histogram("request_prefill_time_seconds", model).observe(rec.prefill_s)
        if rec.first_token_at is not None and rec.end is not None:
            self._histogram("request_decode_time_seconds", model).observe(max(0.0, rec.end - rec.first_token_at))

    def _count(self, name: str, model: str, value: float) -> None:
        self._counters[name][model] = self._counters[name].get(model, 0) + value

    def _histogram(self, name: str, model: str) -> Histogram:
        h = self._hist[name].get(model)
        if h is None:
            h = self._hist[name][model] = Histogram(_HISTOGRAMS[name][1])
        return h

    def render(self, engine_stats: dict[str, list[dict[str, Any]]], models: Iterable[str]) -> str:
        """The exposition text; ``engine_stats`` maps model -> stats of each replica."""
        out: list[str] = []
        models = list(models)
        with self._lock:
            for name, (doc, _) in _HISTOGRAMS.items():
                full = PREFIX + name
                out += [f"# HELP {full} {doc}", f"# TYPE {full} histogram"]
                for model, h in sorted(self._hist[name].items()):
                    out += h.lines(full, f'model_name="{_label(model)}"')
            for name, doc in _COUNTERS.items():
                full = PREFIX + name
                out += [f"# HELP {full} {doc}", f"# TYPE {full} counter"]
                values = self._counters[name]
                for model in sorted(set(values) | set(models)):
                    out.append(f'{full}{{model_name="{_label(model)}"}} {_num(values.get(model, 0))}')
            full = PREFIX + "request_success_total"
            out += [f"# HELP {full} Count of successfully processed requests.", f"# TYPE {full} counter"]
            success = dict(self._success)
            for model in set(models) - {m for m, _ in success}:
                success[(model, "stop")] = 0
            for (model, reason), n in sorted(success.items()):
                out.append(f'{full}{{model_name="{_label(model)}",finished_reason="{_label(reason)}"}} {n}')
        for table, kind in ((_ENGINE_GAUGES, "gauge"), (_ENGINE_COUNTERS, "counter")):
            for name, (key, doc) in table.items():
                full = PREFIX + name
                out += [f"# HELP {full} {doc}", f"# TYPE {full} {kind}"]
                for model in sorted(engine_stats):
                    samples = [v for v in (_stat(s, key) for s in engine_stats[model]) if v is not None]
                    if not samples:
                        continue
                    value = sum(samples) / len(samples) if key == "kv_cache_usage" else sum(samples)
                    out.append(f'{full}{{model_name="{_label(model)}"}} {_num(value)}')
        for section in self.sections:
            out += section()
        return "\n".join(out) + "\n"
