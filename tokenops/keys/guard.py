"""Admission of a request against its key's model list and its key's and tenant's
spend budgets; settlement when its cost is known.

At admission the request reserves an upper estimate of its cost,
``prompt tokens (bound) x input price + max_tokens x n x output price`` summed
over every model its route may call (a cascade's tiers, an ensemble's members),
in the ledger of each budget that applies. It is refused (429 ``budget_exceeded``)
when a budget's committed spend (settled cost plus running reservations) has
reached the budget already. Since the committed spend only ever falls when a
request settles below its estimate, the period's real spend ends below
``budget + one request's estimate``. The prompt bound is the UTF-8 byte count
(a byte-level BPE token holds at least one byte) plus a few tokens of chat
template per message, so it is never below the real prompt.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tokenops.keys.periods import Window, iso, window
from tokenops.keys.records import Budget
from tokenops.keys.registry import KeyRegistry
from tokenops.routing.estimate import request_text
from tokenops.types import Rejection

WARNING_HEADER = "x-tokenops-budget-warning"
#: Chat-template tokens per message (role markers, separators) in the prompt bound.
TEMPLATE_TOKENS_PER_MESSAGE = 8


@dataclass(slots=True)
class _Reserved:
    ledger_keys: list[str]
    estimate: float
    ttl_s: float


@dataclass(slots=True)
class GuardStats:
    refusals: dict[tuple[str, str], int] = field(default_factory=dict)  # (scope, name) -> count
    warnings: dict[tuple[str, str], int] = field(default_factory=dict)
    spend: dict[tuple[str, str], float] = field(default_factory=dict)  # (tenant, key id) -> USD settled here


class KeyGuard:
    def __init__(
        self,
        registry: KeyRegistry,
        ledger: Any,
        prices: dict[str, tuple[float, float]],
        route: Callable[[Any], Any] | None = None,
        prefix: str = "tokenops:budget:",
    ) -> None:
        self.registry = registry
        self.ledger = ledger
        self.prices = prices  # model -> (USD per 1M input tokens, USD per 1M output tokens)
        self.route = route
        self.prefix = prefix
        self.stats = GuardStats()
        self._pending: dict[str, _Reserved] = {}
        self._lock = threading.Lock()

    @property
    def clock(self) -> Callable[[], float]:
        return self.registry.clock

    # -- what applies ---------------------------------------------------------

    def budgets_for(self, tenant: str, key_id: str | None) -> list[tuple[str, str, Budget]]:
        """``(scope, name, budget)`` of the key's and the tenant's budgets."""
        out = []
        key = self.registry.get(key_id) if key_id else None
        if key is not None and key.budget.is_set:
            out.append(("key", key.id, key.budget))
        t = self.registry.tenant(tenant)
        if t is not None and t.budget.is_set:
            out.append(("tenant", t.name, t.budget))
        return out

    def ledger_keys(self, scope: str, name: str, period: str, w: Window) -> tuple[str, ...]:
        return tuple(f"{self.prefix}{scope}:{name}:{period}:{int(start)}" for start in w.starts)

    @staticmethod
    def ttl_s(w: Window, now: float) -> float:
        """Keep a bucket a day beyond the last moment it counts."""
        return (w.end - now if w.end is not None else w.length_s) + 86400

    def estimate_usd(self, request: Any) -> float:
        text = request_text(request)
        num_messages = len(request.messages or ()) if getattr(request, "messages", None) is not None else 1
        prompt = (
            len(request.prompt)
            if isinstance(getattr(request, "prompt", None), list)
            else (len(text.encode("utf-8")) + TEMPLATE_TOKENS_PER_MESSAGE * (num_messages + 1))
        )
        n = request.body.get("n") if isinstance(request.body, dict) else None
        output = max(0, int(request.max_tokens or 0)) * (n if isinstance(n, int) and n > 0 else 1)
        total = 0.0
        for model in self._models_of(request):
            cin, cout = self.prices.get(model, (0.0, 0.0))
            total += (prompt * cin + output * cout) / 1e6
        return total

    def _models_of(self, request: Any) -> list[str]:
        if request.model in self.prices:
            return [request.model]
        decision = None
        if self.route is not None:
            try:
                decision = self.route(request)
            except Exception:  # the real routing step answers the client's error
                decision = None
        if decision is None:
            return list(self.prices)  # unknown: every model once (the route fails later anyway)
        return [decision.model, *decision.escalate_to, *decision.members]

    # -- admission ------------------------------------------------------------

    def admit(self, request: Any) -> Rejection | None:
        key = self.registry.get(request.api_key_id) if request.api_key_id else None
        if key is not None and key.models is not None and request.model not in key.models:
            return Rejection(
                403,
                f"This API key may not use model {request.model!r}; it is limited to {', '.join(key.models)}.",
                code="model_not_allowed",
            )
        budgets = self.budgets_for(request.tenant, request.api_key_id)
        if not budgets:
            return None
        now = self.clock()
        windows = [window(b.period, now) for _, _, b in budgets]
        entries = [(self.ledger_keys(scope, name, b.period, w), b.usd) for (scope, name, b), w in zip(budgets, windows)]
        ttl = max(self.ttl_s(w, now) for w in windows)
        estimate = self.estimate_usd(request)
        try:
            refused, values = self.ledger.reserve(entries, estimate, ttl)
        except Exception as e:  # a budget that cannot be checked is not granted
            return Rejection(
                503,
                f"The spend budget cannot be checked right now ({type(e).__name__}); retry shortly.",
                code="budget_unavailable",
                retry_after_s=1.0,
            )
        if refused >= 0:
            scope, name, b = budgets[refused]
            w = windows[refused]
            try:
                end = w.reset_at(self.ledger.committed(entries[refused][0], flush=False) if w.is_rolling else [], b.usd)
            except Exception:  # only the reset time is missing: say the window's length
                end = now + w.length_s
            with self._lock:
                self.stats.refusals[(scope, name)] = self.stats.refusals.get((scope, name), 0) + 1
            request.decide("budget", f"refused:{scope}")
            wait = max(1.0, end - now)
            period = f"in the last {b.period[:-1]} hours" if w.is_rolling else f"this {b.period} period"
            when = "It resets at" if not w.is_rolling else "Enough of it leaves the window at"
            return Rejection(
                429,
                f"Budget exceeded for {scope} {name!r}: ${values[refused]:.6f} of ${b.usd:.6f} "
                f"spent {period}. {when} {iso(end)} (in {_human(wait)}).",
                code="budget_exceeded",
                retry_after_s=wait,
            )
        with self._lock:
            self._pending[request.id] = _Reserved([keys[-1] for keys, _ in entries], estimate, ttl)
        request.decide("budget", {"reserved_usd": estimate})
        # warn once the spend before this request has reached the soft budget
        warned = [
            (scope, name, b, v - estimate)
            for (scope, name, b), v in zip(budgets, values)
            if b.soft_usd is not None and v - estimate >= b.soft_usd
        ]
        if warned:
            headers = getattr(request, "response_headers", None)
            text = "; ".join(
                f"{scope} {name} at ${v:.6f} of soft budget ${b.soft_usd:.6f}"
                + (f" (hard ${b.usd:.6f})" if b.usd is not None else "")
                for scope, name, b, v in warned
            )
            if headers is not None:
                headers[WARNING_HEADER] = text
            request.decide("budget_warning", text)
            with self._lock:
                for scope, name, _, _ in warned:
                    self.stats.warnings[(scope, name)] = self.stats.warnings.get((scope, name), 0) + 1
        return None

    # -- settlement -----------------------------------------------------------

    def settle(self, request_id: str, cost_usd: float, tenant: str | None = None, key_id: str | None = None) -> bool:
        """Replace the request's estimate by its cost; False when nothing was reserved for it."""
        if cost_usd and (tenant or key_id):
            with self._lock:
                k = (tenant or "", key_id or "")
                self.stats.spend[k] = self.stats.spend.get(k, 0.0) + cost_usd
        with self._lock:
            reserved = self._pending.pop(request_id, None)
        if reserved is None:
            return False
        self.ledger.adjust(reserved.ledger_keys, cost_usd - reserved.estimate, reserved.ttl_s)
        return True

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    # -- views ----------------------------------------------------------------

    def usage(self, scope: str, name: str, budget: Budget) -> dict[str, Any]:
        """Spend in the current period (or rolling window) and what remains of the budget;
        ``resets_at`` is None for a rolling window (spend leaves it bucket by bucket)."""
        w = window(budget.period, self.clock())
        spent = sum(self.ledger.committed(self.ledger_keys(scope, name, budget.period, w)))
        return {
            "period": budget.period,
            "period_start": iso(w.starts[0]),
            "resets_at": None if w.end is None else iso(w.end),
            "spent_usd": spent,
            "budget_usd": budget.usd,
            "soft_budget_usd": budget.soft_usd,
            "remaining_usd": None if budget.usd is None else max(0.0, budget.usd - spent),
        }


def _human(seconds: float) -> str:
    if seconds < 120:
        return f"{math.ceil(seconds)} s"
    if seconds < 7200:
        return f"{math.ceil(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"
