"""A saga's history on real workers (docs/design.md §2.6): each step's intent, claim (by the
worker that ran it) and commit in order, written by the workers' own writes; an operator's
resolve kept beside the ambiguity it settled."""

from __future__ import annotations

from celery_sagas import HistoryEvent
from tests.e2e.conftest import Stack

E = HistoryEvent


def test_a_saga_history_lists_its_steps_in_order(stack: Stack) -> None:
    # given
    stack.worker()

    # when
    handle = stack.shop.order.start({"sku": "H1", "amount": 5, "id": "h1"}, saga_id="hist-1")
    record = stack.wait_settled(handle.saga_id)

    # then
    assert record.state == "completed"
    history = stack.sagas.history("hist-1")
    names = [s.name for s in record.steps]
    per_step = [(e.event, e.step) for e in history if e.step is not None]
    assert per_step == [(ev, name) for name in names for ev in (E.INTENT, E.CLAIMED, E.COMMITTED)]
    claims = [e for e in history if e.event is E.CLAIMED]
    assert [c.ref for c in claims] == [s.claimed_by for s in record.steps]
    assert history.entries[0].event is E.CREATED
    assert (history.entries[-1].event, history.entries[-1].state) == (E.STATE, "completed")
    times = [e.at_ms for e in history]
    assert times == sorted(times)


def test_a_resolve_on_real_workers_keeps_the_ambiguity_and_names_the_operator(
    stack: Stack,
) -> None:
    # given: a saga whose charge raised after the request left (ambiguous)
    stack.worker()
    plan = {"crash": "charge"}
    stack.shop.order.start({"sku": "H2", "amount": 9, "id": "h2", "plan": plan},
                           saga_id="hist-2")
    charge = stack.wait_settled("hist-2").steps[1]

    # when
    stack.sagas.resolve("hist-2", charge.name, charge.effect_id, "committed",
                        result={"charged": 9}, actor="alice", reason="provider confirmed")
    stack.sagas.resume("hist-2", actor="alice")
    record = stack.wait_settled("hist-2")

    # then
    assert record.state == "completed"
    kinds = [(e.event, e.step) for e in stack.sagas.history("hist-2")]
    ambiguous = kinds.index((E.AMBIGUOUS, charge.name))
    resolve = kinds.index((E.RESOLVE, charge.name))
    assert ambiguous < resolve < kinds.index((E.COMMITTED, charge.name))
    entry = stack.sagas.history("hist-2").entries[resolve]
    assert (entry.actor, entry.reason) == ("alice", "provider confirmed")
