"""The sweep's repairs of held steps, one per step kind that needs I/O to be brought in line
(docs/design.md §3.11, §5).

The pure registry of step kinds (``_protocol/kinds.py``) says how a kind wakes from its saga's
record alone; a kind woken by something stored elsewhere (an approval record, a child saga)
also has a repairer here, which the sweep runs on each saga it advances or reports, in this
order, before asking the saga's next decision. A new kind that needs one adds it to
``default_repairers`` (or a sweep is given its own list: ``Sweeper(repairers=...)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ._engine import Engine
from ._protocol import codes
from ._protocol.kinds import APPROVAL, CHILD, StepKind
from ._records import SagaRecord, SagaState
from .stores.base import Fence

__all__ = ["ChildRepair", "GateRepair", "Repairer", "default_repairers"]

_LIVE = (SagaState.RUNNING, SagaState.COMPENSATING)


class Repairer(Protocol):
    """Brings the held steps of one kind in line with what is stored beside the saga."""

    @property
    def kind(self) -> StepKind:
        """The step kind it repairs."""

    def wants(self, saga: SagaRecord) -> bool:
        """Whether ``saga``, as it stands, may have steps to repair."""

    def repair(self, saga: SagaRecord, fence: Fence | None) -> SagaRecord:
        """Repair ``saga``'s steps of this kind (writes carry ``fence``); the saga afterwards."""


@dataclass(frozen=True, slots=True)
class GateRepair:
    """Approval gates: a gate whose approval was decided (or expired) passes or fails."""

    engine: Engine
    kind: StepKind = APPROVAL

    def wants(self, saga: SagaRecord) -> bool:
        """A running saga may have a gate waiting for a decision made meanwhile."""
        return saga.state is SagaState.RUNNING

    def repair(self, saga: SagaRecord, fence: Fence | None) -> SagaRecord:
        """Bring every waiting gate in line with its approval record."""
        return self.engine.reconcile_gates(saga, fence)


@dataclass(frozen=True, slots=True)
class ChildRepair:
    """Child steps: started, settled, undone or cancelled as their child sagas say (§3.7)."""

    engine: Engine
    kind: StepKind = CHILD

    def wants(self, saga: SagaRecord) -> bool:
        """A live saga, or one in review for its child (whose report may have been lost)."""
        return saga.state in _LIVE or saga.error_code == codes.CHILD_IN_REVIEW

    def repair(self, saga: SagaRecord, fence: Fence | None) -> SagaRecord:
        """Bring every child step in line with its child saga."""
        return self.engine.children.reconcile(saga, fence)


def default_repairers(engine: Engine) -> list[Repairer]:
    """The repairers of the built-in step kinds, in the order a sweep runs them."""
    return [GateRepair(engine), ChildRepair(engine)]


def repaired(repairers: list[Repairer], saga: SagaRecord, fence: Fence | None) -> SagaRecord:
    """``saga`` after each repairer that wants it, in turn, repaired it."""
    for repairer in repairers:
        if repairer.wants(saga):
            saga = repairer.repair(saga, fence)
    return saga
