"""A gateway's lifecycle as explicit states: built -> starting -> serving -> draining -> stopped.

``Gateway.begin`` moves it to *starting* (models load in the background), the end of the start
to *serving* (or *failed* when no model loaded), ``begin_drain`` to *draining* and ``stop`` to
*stopped*. A move the table does not allow is a bug in the caller: it raises."""

from __future__ import annotations

import enum


class Phase(enum.Enum):
    BUILT = "built"
    STARTING = "starting"
    SERVING = "serving"
    FAILED = "failed"  # every configured model failed to load
    DRAINING = "draining"
    STOPPED = "stopped"


#: phase -> the phases it may move to
_MOVES: dict[Phase, frozenset[Phase]] = {
    Phase.BUILT: frozenset({Phase.STARTING, Phase.DRAINING, Phase.STOPPED}),
    Phase.STARTING: frozenset({Phase.SERVING, Phase.FAILED, Phase.DRAINING, Phase.STOPPED}),
    Phase.SERVING: frozenset({Phase.DRAINING, Phase.STOPPED}),
    Phase.FAILED: frozenset({Phase.DRAINING, Phase.STOPPED}),
    Phase.DRAINING: frozenset({Phase.STOPPED}),
    Phase.STOPPED: frozenset(),
}


class LifecycleError(RuntimeError):
    """A move the lifecycle does not allow (e.g. serving again after a drain)."""


class Lifecycle:
    """The current phase and the moves between phases."""

    __slots__ = ("phase", "history")

    def __init__(self) -> None:
        self.phase = Phase.BUILT
        #: every phase entered, in order (the first is ``BUILT``)
        self.history: list[Phase] = [Phase.BUILT]

    def can_move(self, to: Phase) -> bool:
        return to in _MOVES[self.phase]

    def move(self, to: Phase) -> None:
        if to is self.phase:
            return
        if not self.can_move(to):
            raise LifecycleError(f"gateway cannot go from {self.phase.value} to {to.value}")
        self.phase = to
        self.history.append(to)

    def move_if_allowed(self, to: Phase) -> bool:
        """Move when the table allows it (a drain that began while models still load keeps draining)."""
        if self.can_move(to):
            self.move(to)
            return True
        return to is self.phase

    @property
    def is_draining(self) -> bool:
        return self.phase in (Phase.DRAINING, Phase.STOPPED)

    @property
    def is_serving(self) -> bool:
        return self.phase is Phase.SERVING
