"""Fan-out and fan-in semantics (ctx.parallel, docs/design.md), driven in-process.

The saga under test charges a card (an earlier step), reserves ``width`` skus in parallel
(branches ``fan.reserve``, ``fan.reserve#2`` …, sku-1 … sku-n), then ships with every
reservation joined (a later step). A branch body first calls the test's hook for its sku, so
a test can make one branch fail, block on a barrier, or act while it runs (claimed and
running), and then answers ``{"reservation": "r-<sku>"}``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from celery_sagas import MemoryStore, StepNotCommitted
from celery_sagas._codec import Codec
from celery_sagas._events import LifecycleEvent
from celery_sagas._records import SAGA, SagaRecord, SagaState, StepState
from celery_sagas.stores.base import Envelope, Fence
from celery_sagas.testing.dispatcher import Sent
from celery_sagas.testing.racing import race
from tests.engine.conftest import Shop, kinds

Hooks = dict[str, Callable[[], object]]


Watch = Callable[[SagaRecord], bool]


class CountingStore(MemoryStore):
    """A MemoryStore that counts refused compare-and-sets (lost races) and can run an action
    once, just before or just after the write of a saga record that matches a condition."""

    def __init__(self) -> None:
        super().__init__()
        self._count_lock = threading.Lock()
        self.lost = 0
        self.before: tuple[Watch, Callable[[], None]] | None = None
        self.after: tuple[Watch, Callable[[], None]] | None = None

    def compare_and_set(
        self, envelope: Envelope, expected_version: int, *, fence: Fence | None = None
    ) -> bool:
        """Delegate, counting refusals and firing the watches."""
        self._fire("before", envelope)
        won = super().compare_and_set(envelope, expected_version, fence=fence)
        if not won:
            with self._count_lock:
                self.lost += 1
        else:
            self._fire("after", envelope)
        return won

    def _fire(self, when: str, envelope: Envelope) -> None:
        watch = getattr(self, when)
        if watch is None or envelope.kind != SAGA:
            return
        if watch[0](Codec().saga(envelope, envelope.id)):
            setattr(self, when, None)
            watch[1]()


@pytest.fixture
def store() -> CountingStore:
    """The reference store, counting lost compare-and-sets."""
    return CountingStore()


def branch(i: int) -> str:
    """The deterministic name of the i-th branch (1-based)."""
    return "fan.reserve" if i == 1 else f"fan.reserve#{i}"


@dataclass
class Fan:
    """The fan-out sagas' knobs: per-sku hooks, and extra branches asked for on replay."""

    hooks: Hooks = field(default_factory=dict)
    extra: list[int] = field(default_factory=list)


@pytest.fixture
def fan(shop: Shop) -> Fan:
    """Register the fan-out step and the sagas using it."""
    knobs = Fan()
    hooks, extra, tasks = knobs.hooks, knobs.extra, shop.tasks

    @shop.sagas.step(name="fan.reserve", compensate="shop.release")
    def reserve(sku: str, qty: int, *, saga: Any = None) -> Any:
        hook = hooks.get(sku)
        if hook is not None:
            hook()
        return shop.script.play("reserve", (sku, qty), {"saga": saga}, {"reservation": f"r-{sku}"})

    @shop.sagas.saga("fan-in")
    def fan_in(ctx: Any, data: dict[str, Any]) -> Any:
        ctx.step(tasks["charge"], "card-1", 30)
        width = data["width"] + len(extra)
        stock = ctx.parallel(*(ctx.call(reserve, f"sku-{i}", i) for i in range(1, width + 1)))
        return ctx.step(tasks["ship"], "o-1", ",".join(s["reservation"] for s in stock))

    @shop.sagas.saga("name-clash")
    def name_clash(ctx: Any, _: Any) -> Any:
        ctx.step(reserve, "sku-0", 0, step_name="fan.reserve#2")
        return ctx.parallel(ctx.call(reserve, "sku-1", 1), ctx.call(reserve, "sku-2", 2))

    return knobs


def start_fan_out(shop: Shop, width: int, saga_id: str = "f-1") -> dict[str, Sent]:
    """Start fan-in and run the charge; return the branch messages by step name."""
    shop.sagas.start("fan-in", {"width": width}, saga_id=saga_id)
    shop.deliver_next()  # charge commits; the branches are recorded and sent
    messages = shop.driver.take()
    assert kinds(messages) == [("step", branch(i)) for i in range(1, width + 1)]
    return {m.step or "": m for m in messages}


def raising(exc: BaseException) -> Callable[[], object]:
    """A hook that makes its branch body raise ``exc``."""

    def hook() -> object:
        raise exc

    return hook


def undo_log(shop: Shop) -> list[tuple[str, Any]]:
    """Compensator calls in order: (name, first argument)."""
    return [(c.name, c.args[0]) for c in shop.script.calls if c.name in ("release", "refund")]


def test_a_step_name_colliding_with_a_numbered_default_goes_to_review(
    shop: Shop, fan: Fan
) -> None:
    # given: "fan.reserve#2" is taken explicitly, then two default-named branches follow
    shop.sagas.start("name-clash", {}, saga_id="c-1")

    # when: the second default name would be "fan.reserve#2" again
    shop.driver.run_until_idle()

    # then: a decision (review), not an error escaping the worker
    record = shop.record("c-1")
    assert (record.state, record.error_code) == (SagaState.MANUAL_REVIEW, "invalid_step_call")
    assert "fan.reserve#2" in (record.reason or "")
    assert [s.name for s in record.steps] == ["fan.reserve#2"]


def test_branches_get_the_task_name_numbered_in_call_order_and_one_group(
    shop: Shop, fan: Fan
) -> None:
    # given / when
    start_fan_out(shop, width=3)

    # then
    steps = shop.record("f-1").steps
    assert [s.name for s in steps] == ["shop.charge", "fan.reserve", "fan.reserve#2", "fan.reserve#3"]
    assert [s.args for s in steps[1:]] == [("sku-1", 1), ("sku-2", 2), ("sku-3", 3)]
    assert steps[0].group is None
    assert len({s.group for s in steps[1:]}) == 1 and steps[1].group is not None
    effect_ids = [e for s in steps for e in (s.effect_id, s.compensation_effect_id)]
    assert len(set(effect_ids)) == len(effect_ids)


def test_every_branch_is_recorded_by_one_write_and_sent_by_one_delivery(shop: Shop, fan: Fan) -> None:
    # given: the charge committed, its continuation not yet run
    shop.sagas.start("fan-in", {"width": 8}, saga_id="f-1")
    [charge] = shop.driver.take()
    version_before = shop.record("f-1").version

    # when
    shop.driver.deliver(charge)

    # then: one write for the claim, one for the commit with all eight intents; eight messages
    record = shop.record("f-1")
    assert record.version == version_before + 2
    assert [s.state for s in record.steps[1:]] == [StepState.EXECUTING] * 8
    assert kinds(shop.driver.take()) == [("step", branch(i)) for i in range(1, 9)]


def test_eight_branches_committing_at_once_from_eight_threads_lose_no_result(
    shop: Shop, fan: Fan, store: CountingStore
) -> None:
    # given: every branch body waits until all eight are running (all claimed)
    messages = list(start_fan_out(shop, width=8).values())
    lost_when_all_ran: list[int] = []
    together = threading.Barrier(8, action=lambda: lost_when_all_ran.append(store.lost), timeout=30)
    for i in range(1, 9):
        fan.hooks[f"sku-{i}"] = together.wait

    # when: eight deliveries at once; their commits race on the saga's compare-and-set
    outcomes = race(lambda i: shop.driver.deliver(messages[i]), threads=8)

    # then: seven commits at least lost a race, reloaded and retried; every result is kept
    assert outcomes == [None] * 8
    assert store.lost - lost_when_all_ran[0] >= 7
    record = shop.record("f-1")
    assert [(s.state, s.result) for s in record.steps[1:9]] == [
        (StepState.COMMITTED, {"reservation": f"r-sku-{i}"}) for i in range(1, 9)
    ]
    assert sorted(c.args[0] for c in shop.script.of("reserve")) == sorted(f"sku-{i}" for i in range(1, 9))
    assert kinds(shop.driver.take()) == [("step", "shop.ship")]  # the fan-in went on once


def test_the_saga_goes_on_only_when_the_last_branch_commits(shop: Shop, fan: Fan) -> None:
    # given: seven of eight branches committed, in reverse order
    messages = start_fan_out(shop, width=8)
    for i in range(8, 1, -1):
        shop.driver.deliver(messages[branch(i)])
    waiting = (shop.record("f-1").state, shop.driver.take())

    # when
    shop.driver.deliver(messages[branch(1)])
    shop.driver.run_until_idle()

    # then: nothing was sent before; ship then got every reservation in call order
    assert waiting == (SagaState.RUNNING, [])
    assert shop.record("f-1").state == SagaState.COMPLETED
    [ship] = shop.script.of("ship")
    assert ship.args == ("o-1", ",".join(f"r-sku-{i}" for i in range(1, 9)))


def test_a_known_failure_waits_for_a_running_branch_then_undoes_in_reverse_commit_order(
    shop: Shop, fan: Fan
) -> None:
    # given: branch 2 commits; while branch 1 runs, branch 3 is declined and branch 4's
    # message (never claimed) arrives
    messages = start_fan_out(shop, width=4)
    shop.clock.advance(1)
    shop.driver.deliver(messages[branch(2)])
    seen_while_running: dict[str, Any] = {}

    def while_branch_1_runs() -> None:
        shop.clock.advance(1)
        shop.driver.deliver(messages[branch(3)])
        shop.driver.deliver(messages[branch(4)])
        seen_while_running.update(state=shop.record("f-1").state, sent=shop.driver.take(),
                                  undone=undo_log(shop))
        shop.clock.advance(1)

    fan.hooks.update({"sku-1": while_branch_1_runs, "sku-3": raising(StepNotCommitted("out_of_stock"))})

    # when
    shop.driver.deliver(messages[branch(1)])
    shop.driver.run_until_idle()

    # then: nothing undone while branch 1 ran; then branch 1 (newest commit), branch 2, charge
    assert seen_while_running == {"state": SagaState.COMPENSATING, "sent": [], "undone": []}
    record = shop.record("f-1")
    assert (record.state, record.error_code) == (SagaState.COMPENSATED, "out_of_stock")
    assert undo_log(shop) == [("release", "sku-1"), ("release", "sku-2"), ("refund", "card-1")]
    assert [(s.state, s.error_code) for s in record.steps[3:]] == [
        (StepState.FAILED, "out_of_stock"), (StepState.FAILED, "not_started"),
    ]
    assert "sku-4" not in [c.args[0] for c in shop.script.of("reserve")]


def test_a_failure_after_the_fan_in_undoes_every_branch_and_the_earlier_step_in_reverse_commit_order(
    shop: Shop, fan: Fan
) -> None:
    # given: the branches commit in the order 3, 1, 4, 2; then ship is declined
    messages = start_fan_out(shop, width=4)
    for i in (3, 1, 4, 2):
        shop.clock.advance(1)
        shop.driver.deliver(messages[branch(i)])
    shop.script.then("ship", StepNotCommitted("no_courier"))

    # when
    shop.driver.run_until_idle()

    # then: each undone exactly once, newest commit first, under its compensation effect id
    record = shop.record("f-1")
    assert (record.state, record.error_code) == (SagaState.COMPENSATED, "no_courier")
    assert undo_log(shop) == [
        ("release", "sku-2"), ("release", "sku-4"), ("release", "sku-1"), ("release", "sku-3"),
        ("refund", "card-1"),
    ]
    used = [c.kwargs["saga"].effect_id for c in shop.script.calls if c.name in ("release", "refund")]
    expected = {s.compensation_effect_id for s in record.steps[:5]}
    assert len(used) == 5 and set(used) == expected


def test_an_abandoned_branch_never_runs_even_when_its_message_comes_twice_and_the_sweep_runs(
    shop: Shop, fan: Fan
) -> None:
    # given: branch 2 is declined before branches 1 and 3 are claimed
    messages = start_fan_out(shop, width=3)
    fan.hooks["sku-2"] = raising(StepNotCommitted("out_of_stock"))

    # when
    shop.driver.deliver(messages[branch(2)])
    shop.driver.run_until_idle()
    for message in (messages[branch(1)], messages[branch(3)]) * 2:
        shop.driver.deliver(message)
    shop.sweep_when_stale()

    # then: no branch body ran; only the earlier charge is undone
    record = shop.record("f-1")
    assert record.state == SagaState.COMPENSATED
    assert shop.script.of("reserve") == []
    assert [s.error_code for s in record.steps[1:]] == ["not_started", "out_of_stock", "not_started"]
    assert undo_log(shop) == [("refund", "card-1")]
    assert shop.driver.take() == []


def test_an_ambiguous_branch_goes_to_review_only_after_the_running_and_queued_branches_settle(
    shop: Shop, fan: Fan
) -> None:
    # given: while branch 1 runs, branch 3's outcome becomes unknown and branch 4 (queued) runs
    messages = start_fan_out(shop, width=4)
    shop.driver.deliver(messages[branch(2)])
    seen: list[SagaState] = []

    def while_branch_1_runs() -> None:
        shop.driver.deliver(messages[branch(3)])
        seen.append(shop.record("f-1").state)
        shop.driver.deliver(messages[branch(4)])
        seen.append(shop.record("f-1").state)

    fan.hooks.update({"sku-1": while_branch_1_runs, "sku-3": raising(ConnectionError("reset"))})

    # when
    shop.driver.deliver(messages[branch(1)])
    shop.driver.run_until_idle()

    # then: running until the last branch settled, then review naming branch 3; nothing undone
    assert seen == [SagaState.RUNNING, SagaState.RUNNING]
    record = shop.record("f-1")
    assert (record.state, record.error_code) == (SagaState.MANUAL_REVIEW, "ambiguous_step")
    assert shop.step(branch(3), "f-1").effect_id in (record.reason or "")
    assert [s.state for s in record.steps[1:]] == [
        StepState.COMMITTED, StepState.COMMITTED, StepState.AMBIGUOUS, StepState.COMMITTED,
    ]
    assert undo_log(shop) == [] and shop.script.of("ship") == []


def test_resolving_an_ambiguous_branch_as_committed_lets_the_fan_in_go_on(shop: Shop, fan: Fan) -> None:
    # given: branch 1 ambiguous, branch 2 committed: the saga is in review
    messages = start_fan_out(shop, width=2)
    fan.hooks["sku-1"] = raising(ConnectionError("reset"))
    shop.driver.deliver(messages[branch(1)])
    shop.driver.deliver(messages[branch(2)])
    effect = shop.step(branch(1), "f-1").effect_id

    # when: the operator confirms the provider did reserve sku-1
    shop.sagas.resolve("f-1", branch(1), effect, "committed", result={"reservation": "r-found"})
    shop.sagas.resume("f-1")
    shop.driver.run_until_idle()

    # then
    assert shop.record("f-1").state == SagaState.COMPLETED
    assert [c.args for c in shop.script.of("ship")] == [("o-1", "r-found,r-sku-2")]


def test_cancel_during_a_fan_out_waits_for_the_running_branch_and_abandons_queued_ones(
    shop: Shop, fan: Fan
) -> None:
    # given: branch 2 committed; branch 1 running; branch 3 queued
    messages = start_fan_out(shop, width=3)
    shop.clock.advance(1)
    shop.driver.deliver(messages[branch(2)])
    seen: dict[str, Any] = {}

    def while_branch_1_runs() -> None:
        seen["cancel"] = shop.sagas.cancel("f-1").state
        shop.driver.deliver(messages[branch(3)])
        seen.update(sent=shop.driver.take(), undone=undo_log(shop))
        shop.clock.advance(1)

    fan.hooks["sku-1"] = while_branch_1_runs

    # when
    shop.driver.deliver(messages[branch(1)])
    shop.driver.run_until_idle()

    # then
    assert seen == {"cancel": SagaState.COMPENSATING, "sent": [], "undone": []}
    record = shop.record("f-1")
    assert (record.state, record.error_code) == (SagaState.COMPENSATED, "cancelled")
    assert undo_log(shop) == [("release", "sku-1"), ("release", "sku-2"), ("refund", "card-1")]
    assert shop.step(branch(3), "f-1").error_code == "not_started"
    assert "sku-3" not in [c.args[0] for c in shop.script.of("reserve")]


def test_a_fan_out_that_asks_for_more_branches_on_replay_is_nondeterministic(
    shop: Shop, fan: Fan
) -> None:
    # given: three branches recorded
    messages = start_fan_out(shop, width=3)

    # when: the next replay asks for four
    fan.extra.append(4)
    shop.driver.deliver(messages[branch(1)])

    # then
    record = shop.record("f-1")
    assert (record.state, record.error_code) == (SagaState.MANUAL_REVIEW, "nondeterministic")
    assert len(record.steps) == 4


def _in_state(name: str, state: StepState, started: bool) -> Watch:
    def matches(record: SagaRecord) -> bool:
        step = record.step(name)
        return step is not None and step.state is state and (step.started_at_ms is not None) == started

    return matches




@pytest.mark.parametrize(
    ("when", "state"),
    [("after", StepState.EXECUTING), ("before", StepState.COMMITTED)],
    ids=["claim-written-body-not-begun", "body-returned-commit-not-written"],
)
def test_a_running_branch_is_not_judged_lost_by_a_sibling_in_the_same_process(
    shop: Shop, fan: Fan, store: CountingStore, events: list[LifecycleEvent], when: str,
    state: StepState,
) -> None:
    # given: at that moment of branch 1's delivery, branch 2 runs to its commit in this process
    messages = start_fan_out(shop, width=2)
    setattr(store, when, (_in_state(branch(1), state, started=True),
                          lambda: shop.driver.deliver(messages[branch(2)])))

    # when
    shop.driver.deliver(messages[branch(1)])

    # then: nobody thought branch 1 had vanished
    assert [e.step for e in events if e.phase == "ambiguous"] == []


def test_an_ambiguous_branch_and_a_failed_one_go_to_review_without_compensating_anything(
    shop: Shop, fan: Fan
) -> None:
    # given: branch 1 ambiguous; branch 3 queued
    messages = start_fan_out(shop, width=3)
    fan.hooks.update({"sku-1": raising(ConnectionError("reset")),
                      "sku-2": raising(StepNotCommitted("out_of_stock"))})
    shop.driver.deliver(messages[branch(1)])

    # when: branch 2 fails with a known outcome, then branch 3's message arrives
    shop.driver.deliver(messages[branch(2)])
    shop.driver.deliver(messages[branch(3)])
    shop.driver.run_until_idle()

    # then: branch 3 abandoned; the charge is not refunded blindly
    record = shop.record("f-1")
    assert (record.state, record.error_code) == (SagaState.MANUAL_REVIEW, "ambiguous_step")
    assert [s.state for s in record.steps] == [
        StepState.COMMITTED, StepState.AMBIGUOUS, StepState.FAILED, StepState.FAILED,
    ]
    assert shop.step(branch(3), "f-1").error_code == "not_started"
    assert undo_log(shop) == [] and shop.script.of("reserve") == []


def test_an_empty_fan_out_returns_no_results_and_the_saga_goes_on(shop: Shop, fan: Fan) -> None:
    # given: a width taken from the input that happens to be zero
    shop.sagas.start("fan-in", {"width": 0}, saga_id="f-0")

    # when
    shop.driver.run_until_idle()

    # then
    record = shop.record("f-0")
    assert record.state == SagaState.COMPLETED
    assert [s.name for s in record.steps] == ["shop.charge", "shop.ship"]
    assert [c.args for c in shop.script.of("ship")] == [("o-1", "")]


def test_a_list_passed_to_parallel_instead_of_calls_goes_to_review(shop: Shop, fan: Fan) -> None:
    # given
    reserve = shop.sagas.app.tasks["fan.reserve"]

    @shop.sagas.saga("list-not-unpacked")
    def run(ctx: Any, _: Any) -> Any:
        return ctx.parallel([ctx.call(reserve, "sku-1", 1)])

    # when
    shop.sagas.start("list-not-unpacked", {}, saga_id="l-1")
    shop.driver.run_until_idle()

    # then
    record = shop.record("l-1")
    assert (record.state, record.error_code) == (SagaState.MANUAL_REVIEW, "invalid_step_call")
    assert "unpack" in (record.reason or "") and record.steps == ()
