"""The engine's step-time model, fit online from the steps it ran: a step costs about
``fixed + row_s * decode rows + token_s * prompt tokens``. On a CPU a step's time grows with what it
computes; on a GPU the slopes are near zero while the step is memory-bound. The scheduler sizes the
batch work it puts beside interactive work with it (``batch_step_overhead``,
:func:`tokenops.engine.core.priority_classes.overhead_allowance`).

Exponentially weighted least squares over the recent steps (about the last ``1 / (1 - decay)``),
pulled lightly toward a prior so that steps that all look alike (only decodes of one width, say)
still give finite slopes: the prior is about SmolLM2-135M on 2 CPU cores. Each coefficient is held
at least at a small floor (the others fit again without it), and a step counts at most ``_CLIP``
times its estimate. The pull is light: on a box shared with other jobs, steps of one or two shapes
with noisy times can still leave the split between the fixed cost and the row cost wrong (the
estimate of the steps seen stays within their times).

Beside the fit, decode steps as measured: the time of decode-only steps by their interactive
rows ``k`` and batch rows ``b``, an exponential average per ``(k, b)``. On a CPU a step's time is not a
line in its rows: measured through serve on the default model (2 cores), one interactive decode
5.9 ms and 8.0 with a batch row beside it (+2.05 ms), two 8.0 and 9.7 (+1.7), where the line through
every step the engine ran said 7.6 ms for one row and 1.2 ms a row. Priced by the line, the batch took
about twice its share of an interactive step's time (TPOT p95 1.21-1.34x at ``batch_step_overhead =
0.1``). So where they were seen often enough, the interactive step's own time is ``(k, 0)``'s and a
batch row's cost beside it ``(k, 1)``'s less ``(k, 0)``'s (:meth:`decode_s`, :meth:`row_s_beside`):
the very thing the allowance prices, measured at the widths the engine runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

_PRIOR = (0.015, 0.0006, 0.0006)  # seconds: fixed, per decode row, per prompt token
_MIN_STEPS = 8  # the prior alone until this many steps were seen
#: A step's time counts at most this many times the fit's estimate for it: on a box shared with
#: other jobs a step now and then takes seconds (the threads descheduled), and one such step would
#: otherwise pull the fixed cost up tenfold and the slopes to their floors (no bound on the batch).
_CLIP = 3.0
_CURVE_DECAY = 0.98  # the average per (interactive rows, batch rows): about the last 50 such steps
_CURVE_MIN_STEPS = 20  # a shape is read off the measured steps once this many of it were seen


class StepCost:
    """``observe`` each step, ``coefficients`` for the current fit (seconds)."""

    def __init__(self, prior: tuple[float, float, float] = _PRIOR, decay: float = 0.995, pull: float = 0.02) -> None:
        self.prior = prior
        self.decay = decay
        self.pull = pull
        self.num_steps = 0
        self._xtx = [[0.0] * 3 for _ in range(3)]
        self._xty = [0.0] * 3
        self._fit: tuple[float, float, float] | None = None
        #: Seconds the engine spent in steps, in all and in steps with interactive work in them (what
        #: an engine's interactive traffic keeps of its time; a batch has the rest to itself).
        self.busy_s = 0.0
        self.interactive_busy_s = 0.0
        #: decode-only steps by (interactive rows, batch rows): [average seconds, steps seen]
        self._curve: dict[tuple[int, int], list[float]] = {}

    def observe(self, num_rows: int, num_tokens: int, seconds: float) -> None:
        if self.num_steps >= _MIN_STEPS:
            seconds = min(seconds, _CLIP * self.estimate(num_rows, num_tokens))
        x = (1.0, float(num_rows), float(num_tokens))
        for i in range(3):
            self._xty[i] = self.decay * self._xty[i] + x[i] * seconds
            for j in range(3):
                self._xtx[i][j] = self.decay * self._xtx[i][j] + x[i] * x[j]
        self.num_steps += 1
        self._fit = None

    def observe_chunks(self, chunks: Iterable[Any], seconds: float) -> None:
        """A step's scheduled chunks (``num_tokens``, ``start_pos``, ``seq.is_batch``): decode rows and
        prompt tokens, and whether the step held interactive work."""
        rows = tokens = batch_rows = 0
        interactive = False
        for c in chunks:
            if c.num_tokens == 1 and c.start_pos > 0:
                rows += 1
                batch_rows += c.seq.is_batch
            else:
                tokens += c.num_tokens
            interactive = interactive or not c.seq.is_batch
        self.busy_s += seconds
        if interactive:
            self.interactive_busy_s += seconds
        if rows and not tokens:
            self._observe_decode((rows - batch_rows, batch_rows), seconds)
        self.observe(rows, tokens, seconds)

    def _observe_decode(self, shape: tuple[int, int], seconds: float) -> None:
        point = self._curve.get(shape)
        if point is None:
            self._curve[shape] = [seconds, 1]
            return
        seconds = min(seconds, _CLIP * point[0])  # a descheduled step moves the average little
        weight = max(1.0 / (point[1] + 1), 1.0 - _CURVE_DECAY)  # a plain mean over the first steps
        point[0] += weight * (seconds - point[0])
        point[1] += 1

    def decode_s(self, num_rows: int, num_batch_rows: int = 0) -> float | None:
        """The measured time of a decode-only step of ``num_rows`` interactive and ``num_batch_rows``
        batch rows; None until seen often enough."""
        point = self._curve.get((num_rows, num_batch_rows))
        return point[0] if point is not None and point[1] >= _CURVE_MIN_STEPS else None

    def probe(self, num_rows: int) -> int | None:
        """The batch rows a decode-only step beside ``num_rows`` interactive decode rows carries to
        measure a price the allowance lacks: 0 while ``(num_rows, 0)`` is unmeasured, then 1 while
        ``(num_rows, 1)`` is; None once both are (or while the fit runs on its prior alone). Without it
        a fit whose row cost sat at its floor (steps of one shape, as a running batch makes them) let
        every batch row into every step, so neither shape was ever seen: measured through serve on the
        default model, only ``1+3`` steps with the row priced at 1e-7 s."""
        if self.num_steps < _MIN_STEPS:
            return None
        if self.decode_s(num_rows) is None:
            return 0
        return 1 if self.decode_s(num_rows, 1) is None else None

    def decode_steps(self) -> dict[str, float]:
        """The measured decode-only steps seen often enough, ``"k+b"`` (interactive + batch rows) -> seconds."""
        return {f"{k}+{b}": point[0] for (k, b), point in sorted(self._curve.items()) if point[1] >= _CURVE_MIN_STEPS}

    def row_s_beside(self, num_rows: int) -> float:
        """What one batch decode row adds to a step of ``num_rows`` interactive decode rows: the
        measured steps with one beside them less those without, where both were seen often enough and
        it is positive, else the fit's per-row cost."""
        alone, beside = self.decode_s(num_rows), self.decode_s(num_rows, 1)
        if alone is not None and beside is not None and beside > alone:
            return beside - alone
        return self.coefficients()[1]

    def coefficients(self) -> tuple[float, float, float]:
        """(fixed, per decode row, per prompt token) in seconds, each > 0."""
        if self.num_steps < _MIN_STEPS:
            return self.prior
        if self._fit is None:
            a = [row[:] for row in self._xtx]
            b = self._xty[:]
            for i in range(3):  # ridge toward the prior
                a[i][i] += self.pull
                b[i] += self.pull * self.prior[i]
            self._fit = _fit_with_floors(a, b) or self.prior
        return self._fit

    def estimate(self, num_rows: int, num_tokens: int) -> float:
        fixed, row, token = self.coefficients()
        return fixed + row * num_rows + token * num_tokens


_FLOORS = (1e-5, 1e-7, 1e-7)  # seconds: fixed, per row, per token


def _fit_with_floors(a: list[list[float]], b: list[float]) -> tuple[float, float, float] | None:
    """The least-squares fit (normal equations ``a x = b``) with each coefficient at least its floor:
    a coefficient the free fit puts below its floor is held at the floor and the others are fit
    again without it (clamping it alone would keep the others' compensation for its negative value:
    with noisy steps, a negative row slope came with a fixed cost many times any step's time)."""
    held: dict[int, float] = {}
    for _ in range(4):  # each pass holds one more, and with all held the last returns
        free = [i for i in range(3) if i not in held]
        sub_a = [[a[i][j] for j in free] for i in free]
        sub_b = [b[i] - sum(a[i][j] * v for j, v in held.items()) for i in free]
        sub = _solve(sub_a, sub_b) if free else []
        if sub is None:
            return None
        x = dict(held)
        x.update(zip(free, sub, strict=True))
        low = [i for i in free if x[i] < _FLOORS[i]]
        if not low:
            return x[0], x[1], x[2]
        held.update((i, _FLOORS[i]) for i in low)
    return _FLOORS


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting (n x n, n <= 3); None when singular."""
    n = len(a)
    m = [a[i][:] + [b[i]] for i in range(n)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-12:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            for c in range(col, n + 1):
                m[r][c] -= f * m[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][c] * x[c] for c in range(r + 1, n))) / m[r][r]
    return x
