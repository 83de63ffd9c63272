"""One ``tokenops tune`` session: build the space, drive the target (a running
server's live tunables, or a launched server for restart ones: the bundled
engine, or vLLM/SGLang through a launcher plugin), score each configuration by
its goodput, and report the winner next to the default."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tokenops.bench.loadgen import fetch_model
from tokenops.bench.metrics import BenchSummary
from tokenops.bench.runner import BenchPlan, run_level
from tokenops.bench.workloads import build_workload
from tokenops.slo import SLO
from tokenops.tune.deployment import Deployment, filter_relevant, work_of
from tokenops.tune.goodput import BracketConfig, GoodputResult, MeasureFn, find_goodput, overrun
from tokenops.tune.launcher import CommandLineLauncher, Launcher, LaunchOptions, ServerProcess
from tokenops.tune.search import Budget, Trial, TuneOutcome, Tuner
from tokenops.tune.space import SearchSpace
from tokenops.tune.target import AdminClient, TuneError, measure, tunables_from_server


@dataclass(slots=True)
class TunePlan:
    slos: list[SLO]
    budget: Budget
    url: str | None = None
    admin_key: str | None = None
    launch: bool = False
    #: With ``launch``: the launcher (``tokenops_register_launchers``) that starts the server.
    engine: str = "tokenops"
    model_path: str | None = None
    #: With ``launch``: replaces the launcher's program; extra arguments passed through.
    launcher_cmd: str | None = None
    launcher_args: list[str] = field(default_factory=list)
    ready_timeout_s: float = 600.0
    model: str | None = None
    workload: str = "synthetic"
    workload_options: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    only: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)
    overrides: dict[str, list[Any]] = field(default_factory=dict)
    span: float = 8.0
    #: Each measurement lasts about ``measure_s`` seconds, with at least ``min_requests`` requests.
    measure_s: float = 10.0
    min_requests: int = 20
    #: Cap per measurement; high enough that fast rates still run about ``measure_s`` (a short
    #: burst would be absorbed by a large batch and pass at rates the server cannot sustain).
    max_requests: int = 3000
    start_rate: float | None = None
    arrival: str = "poisson"
    endpoint: str = "chat"
    ignore_eos: bool = True
    bracket: BracketConfig = field(default_factory=BracketConfig)
    #: After the study, measure the default and the winner back to back at the winner's goodput.
    validate: bool = False
    #: The target is this folder's ``tokenops serve``, reached through its store channel (no admin key).
    local_admin: Any = None

    def __post_init__(self) -> None:
        if not self.slos:
            raise TuneError("give at least one --slo, e.g. --slo p95=200ms")
        if self.launch == bool(self.url):
            raise TuneError(
                "give --url URL of a running server, or --launch to start an engine (--engine tokenops, vllm or sglang)"
            )
        if not self.launch and (self.engine != "tokenops" or self.launcher_cmd or self.launcher_args):
            raise TuneError("--engine, --launcher-cmd and --launcher-arg go with --launch")
        if self.min_requests < 5 or self.max_requests < self.min_requests:
            raise TuneError("--min-requests must be >= 5 and <= --max-requests")


@dataclass(slots=True)
class TuneReport:
    study: str
    model: str
    outcome: TuneOutcome
    space: SearchSpace
    plan: TunePlan
    elapsed_s: float
    applied: dict[str, Any] = field(default_factory=dict)
    #: Back-to-back re-measurements (``--validate``): name, params, rate, met, slo values.
    validation: list[dict[str, Any]] = field(default_factory=list)
    #: The winner as the launched server's own flags (vLLM, SGLang), for its command line.
    launch_flags: list[str] = field(default_factory=list)


class TuneSession:
    """Owns the target for the length of a study."""

    def __init__(
        self,
        plan: TunePlan,
        on_trial: Callable[[Trial, TuneOutcome], None] | None = None,
        on_status: Callable[[str], None] | None = None,
    ) -> None:
        self.plan = plan
        self.on_trial = on_trial
        self.on_status = on_status or (lambda msg: None)
        self.launcher: Launcher | None = None
        self.server: ServerProcess | None = None
        self.admin: AdminClient | None = None
        self.original: dict[str, Any] = {}
        self.restart_names: set[str] = set()
        self.space: SearchSpace | None = None
        #: (name, why) of tunables left out because they cannot change this deployment
        self.irrelevant: list[tuple[str, str]] = []
        self.deployment: Deployment | None = None
        #: live values last sent to the target, so only changes are sent (and audited)
        self.current: dict[str, Any] = {}
        self._num_measurements = 0
        #: The served model name, read again after every relaunch.
        self.model: str | None = plan.model
        self.bench = BenchPlan(
            url=plan.url or "http://127.0.0.1:1",
            workload=plan.workload,
            seed=plan.seed,
            slos=plan.slos,
            arrival=plan.arrival,
            endpoint=plan.endpoint,
            ignore_eos=plan.ignore_eos,
            rates=[1.0],
        )

    # -- target ---------------------------------------------------------------

    def _launch(self, restart_params: dict[str, Any]) -> None:
        assert self.launcher is not None
        if self.server is not None:
            self.server.stop()
            self.server = None
        self.on_status(f"launching {self.launcher.name} with {restart_params or 'defaults'}")
        self.server = self.launcher.launch(restart_params)
        self.current = {}  # a fresh server starts from its defaults
        if self.admin is not None:
            self.admin.close()
            self.admin = None
        if self.launcher.has_admin_api:
            self.admin = AdminClient(self.server.url, self.server.admin_key)
        self.bench.url = self.server.url
        self.model = self.plan.model or asyncio.run(fetch_model(self.server.url))

    def _make_launcher(self) -> Launcher:
        from tokenops.plugin_manager import get_launchers

        p = self.plan
        launchers = get_launchers()
        if p.engine not in launchers:
            raise TuneError(
                f"unknown --engine {p.engine!r}; available: {', '.join(launchers) or 'none'} "
                "(launchers come from plugins)"
            )
        launcher = launchers[p.engine](
            LaunchOptions(
                model=p.model_path,
                command=p.launcher_cmd,
                extra_args=list(p.launcher_args),
                ready_timeout_s=p.ready_timeout_s,
            )
        )
        launcher.check()
        return launcher

    def _build_space(self) -> SearchSpace:
        p = self.plan
        if p.launch:
            from tokenops.plugin_manager import get_tunables

            launcher = self.launcher = self._make_launcher()
            # live tunables need the admin API; everything else is the launcher's, applied by relaunching
            tunables = [t for t in get_tunables() if launcher.owns(t.name) or (t.live and launcher.has_admin_api)]
            names = {t.name for t in tunables}
            for name in p.overrides:
                if name not in names and name in get_tunables():
                    raise TuneError(
                        f"--param {name}: the {launcher.name} launcher cannot set it; its tunables "
                        f"start with {' or '.join(launcher.prefixes)}"
                    )
            # a launched server is one fresh engine: nothing to cascade, route or balance
            tunables = self._relevant(tunables, Deployment({"launched": 1}, {}, {"launched": "local"}, self.work))
            space = SearchSpace.build(tunables, True, p.only, p.exclude, p.overrides, p.span)
            self.restart_names = {d.name for d in space.dims if not (d.tunable.live and launcher.has_admin_api)}
            return space
        # the same facts whether the server is found by its socket or given by --url
        assert p.url is not None  # TunePlan has a URL exactly when it does not launch
        self.admin = p.local_admin if p.local_admin is not None else AdminClient(p.url, p.admin_key)
        deployment = Deployment.from_server_info(self.admin.info, self.work)
        tunables, self.original = tunables_from_server(self.admin.tunables())
        self.current = dict(self.original)
        tunables = self._relevant(tunables, deployment)
        return SearchSpace.build(tunables, False, p.only, p.exclude, p.overrides, p.span)

    @property
    def work(self) -> set[str]:
        """The kinds of work the measured workload sends (tunables of other kinds are not searched)."""
        return work_of(self.plan.endpoint)

    def _relevant(self, tunables: list, deployment: Deployment) -> list:
        from tokenops.plugin_manager import get_tunables

        self.deployment = deployment
        rel = filter_relevant(tunables, deployment, declared=get_tunables(), keep=self.plan.overrides)
        only = self.plan.only
        searchable = {t.name for t in tunables if t.searchable}
        # report only what the search would otherwise have tried
        self.irrelevant = [
            (n, why)
            for n, why in rel.dropped
            if n in searchable and (not only or any(n == o or n.startswith(o.rstrip(".") + ".") for o in only))
        ]
        return rel.kept

    def _apply(self, params: dict[str, Any]) -> None:
        restart = {k: v for k, v in params.items() if k in self.restart_names}
        if self.plan.launch and (self.server is None or self.server.params != restart):
            self._launch(restart)
        live = {k: v for k, v in params.items() if k not in self.restart_names and self.current.get(k, ...) != v}
        if live:
            assert self.admin is not None
            self.admin.patch(live)
            self.current.update(live)

    # -- measuring ------------------------------------------------------------

    def _fresh_requests(self, n: int) -> list:
        """New prompts for every measurement: a configuration measured later must not find
        its prompts in a prefix cache an earlier measurement warmed."""
        p = self.plan
        self._num_measurements += 1
        seed = int(np.random.SeedSequence([p.seed, self._num_measurements]).generate_state(1)[0])
        from tokenops.plugin_manager import get_workloads

        return build_workload(p.workload, n, seed, registered=get_workloads(), **p.workload_options)

    def _measure_fn(self, requests: list) -> MeasureFn:
        p = self.plan

        def fn(rate: float, repeat: int = 0) -> BenchSummary:
            # about measure_s of arrivals; at slow rates fewer than min_requests (but >= 5), so that
            # no measurement lasts much over 2 x measure_s
            floor = min(p.min_requests, max(5, math.ceil(rate * 2 * p.measure_s)))
            n = int(min(p.max_requests, max(floor, math.ceil(rate * p.measure_s))))
            bench = dataclasses.replace(self.bench, seed=p.seed + 1000 * repeat) if repeat else self.bench
            assert self.model is not None
            s = measure(bench, self.model, self._fresh_requests(n), rate)
            again = " (repeat)" if repeat else ""
            errors = f" errors {s.errors}" if s.errors else ""
            verdict = "met" if s.is_slo_met else "missed"
            if s.is_slo_met and overrun(s, p.bracket) is not None:
                verdict = f"did not keep up (took {s.duration_s:.0f}s), SLO values"
            self.on_status(
                f"  rate {rate:.3g}/s x {n}{again}: {verdict} "
                + ", ".join(f"{r['label'].split('=')[0]}={_fmt(r['value_s'])}" for r in s.slo)
                + errors
            )
            return s

        return fn

    def _probe_start_rate(self, model: str, requests: list) -> float:
        """1 / mean E2E of a few requests sent one at a time: the rate one slot sustains."""
        res = asyncio.run(run_level(self.bench, model, requests[:3], None, 1))
        e2es = [r.e2e_s for r in res.results if r.is_ok and r.e2e_s]
        if not e2es:
            raise TuneError(f"the target answered none of 3 probe requests: {res.summary.errors}")
        return max(self.plan.bracket.min_rate, 1.0 / (sum(e2es) / len(e2es)))

    def run(self) -> TuneReport:
        p = self.plan
        t0 = time.monotonic()
        study = "tune-" + uuid.uuid4().hex[:10]
        if threading.current_thread() is threading.main_thread():
            # a terminated tune still stops the engine it launched (the finally below)
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        space = self.space = self._build_space()
        try:
            if p.launch:
                self._apply(space.default())
            if self.model is None:
                self.model = asyncio.run(fetch_model(self.bench.url))
            model = self.model
            for name, why in self.irrelevant:
                self.on_status(f"dropped {name}: {why}")
            if not space.dims:
                raise TuneError(f"nothing to search: {self._why_empty(space)}")
            requests = self._fresh_requests(3)
            self._apply(space.default())
            start = p.start_rate or self._probe_start_rate(model, requests)
            self.on_status(f"space: {', '.join(f'{d.name} {d.values}' for d in space.dims)}; start rate {start:.3g}/s")
            fn = self._measure_fn(requests)
            # a rate at which 5 requests take over 4 measurement lengths is not measured: below it the
            # configuration counts as infeasible (said once here, so a "nothing met" verdict has its floor)
            floor = max(p.bracket.min_rate, 5 / (4 * p.measure_s))
            bracket = dataclasses.replace(p.bracket, min_rate=floor)
            self.on_status(f"slowest rate measured: {floor:.3g}/s (--measure-seconds sets it)")

            def evaluate(params: dict[str, Any], incumbent: float | None, deadline: float | None) -> GoodputResult:
                try:
                    self._apply(params)
                except TuneError as e:
                    self.on_status(f"  configuration failed: {e}")
                    return GoodputResult(0.0, "failed", estimate=0.0)
                # no measurement starts unless it can end before the budget does
                stop = None if deadline is None else deadline - 1.5 * p.measure_s - 2.0
                return find_goodput(fn, start, bracket, incumbent, stop)

            outcome = Tuner(space, evaluate, p.budget, p.seed, on_trial=self.on_trial).run(started=t0)
            best = outcome.best
            validation = self._validate(space, best, fn) if p.validate and best is not None and best.number != 0 else []
            if p.url and self.original:
                self._restore(space)
        finally:
            if self.server is not None:
                self.server.stop()
        flags = []
        if isinstance(self.launcher, CommandLineLauncher) and outcome.best is not None:
            flags = self.launcher.flag_args({k: v for k, v in outcome.best.params.items() if self.launcher.owns(k)})
        return TuneReport(
            study, model, outcome, space, p, time.monotonic() - t0, validation=validation, launch_flags=flags
        )

    def _why_empty(self, space: SearchSpace) -> str:
        """Why ``space`` has nothing to search: the tunables found irrelevant to this deployment, and the
        space's own reasons unless every ``--only`` it did not match was one of those."""
        irrelevant = {n for n, _ in self.irrelevant}
        space.unmatched = [
            o for o in space.unmatched if not any(n == o or n.startswith(o.rstrip(".") + ".") for n in irrelevant)
        ]
        reasons = [f"{n} {why}" for n, why in self.irrelevant]
        if space.dropped or space.unmatched or not reasons:
            reasons.append(space.why_empty())
        return "; ".join(reasons)

    def _validate(self, space: SearchSpace, best: Trial, fn: MeasureFn) -> list[dict[str, Any]]:
        """``--validate``: the default and the winner measured back to back at the winner's goodput with
        the same arrivals, so the ratio the study reports is checked on one footing."""
        self.on_status(f"validating at {best.goodput:.3g}/s: the default, then the winner, same arrivals")
        validation = []
        for name, params in (("default", space.default()), ("winner", best.params)):
            self._apply(params)
            s = fn(best.goodput, 2)
            validation.append(
                {
                    "name": name,
                    "params": params,
                    "rate": best.goodput,
                    "met": s.is_slo_met,
                    "achieved_rps": s.request_rate,
                    "errors": s.num_errors,
                    "slo": {r["label"]: r["value_s"] for r in s.slo},
                }
            )
        return validation

    def _restore(self, space: SearchSpace) -> None:
        """Put a ``--url`` server's searched tunables back as they were; only what differs, so the
        audit shows real changes."""
        restore = {
            k: self.original[k]
            for k in space.names
            if k in self.original and self.current.get(k, ...) != self.original[k]
        }
        assert self.admin is not None  # set by _build_space for a --url run
        self.admin.patch(restore, actor="tune (restore)")
        self.current.update(restore)

    def close(self) -> None:
        if self.admin is not None:
            self.admin.close()
        if self.plan.local_admin is not None and self.plan.local_admin is not self.admin:
            self.plan.local_admin.close()


def apply_winner(url: str, admin_key: str | None, params: dict[str, Any]) -> dict[str, Any]:
    """Push the winner's values to a running server (``--apply``)."""
    admin = AdminClient(url, admin_key)
    try:
        return admin.patch(params, actor="tune")
    finally:
        admin.close()


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f}ms"
