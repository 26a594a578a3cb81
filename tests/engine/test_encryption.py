"""Payload encryption at rest through the engine (docs/design.md §7): sagas run, compensate and
rotate keys with every stored body sealed; a process without the right key reads the record
with ``ENCRYPTED`` payloads, reports it as ``undecryptable`` and never acts on it."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import replace

import pytest
from celery import Celery
from cryptography.fernet import Fernet

from celery_sagas import ENCRYPTED, MemoryStore, Sagas, StepNotCommitted
from celery_sagas._findings import corrupt_finding
from celery_sagas._records import SagaState, StepState
from celery_sagas.errors import SagaConfigurationError, StoreError, UndecryptableRecord
from celery_sagas.stores.base import Envelope, Store
from celery_sagas.testing import FrozenClock
from celery_sagas.testing.driver import SagaDriver
from celery_sagas.testing.proxy import StoreProxy
from tests.engine.conftest import SYNC_BACKOFF_MS, Script, Shop, register_shop

MARK = "MARKER-7f3a"
OLD_KEY = Fernet.generate_key()
NEW_KEY = Fernet.generate_key()


@pytest.fixture
def sagas(app: Celery, store: MemoryStore, clock: FrozenClock) -> Sagas:
    """Sagas that seal payloads with OLD_KEY (overrides the engine conftest's)."""
    return Sagas(app, store=store, allow_non_durable=True, clock=clock, encryption_keys=[OLD_KEY])


def _bodies(store: MemoryStore) -> str:
    return "\n".join(envelope.body for envelope in store._records.values())


def _other(store: Store, clock: FrozenClock, keys: list[bytes]) -> tuple[Sagas, Shop]:
    """Another process's Sagas over the same store, with ``keys``."""
    app = Celery(f"other-{uuid.uuid4().hex[:8]}", set_as_current=False)
    sagas = Sagas(app, store=store, allow_non_durable=True, clock=clock, encryption_keys=keys)
    script = Script()
    tasks, definitions = register_shop(sagas, script)
    return sagas, Shop(sagas, SagaDriver(sagas), clock, script, tasks, definitions)


def test_a_saga_completes_with_no_payload_in_clear_in_the_store(shop: Shop, store: MemoryStore) -> None:
    # when
    shop.start_order(card=MARK)
    shop.driver.run_until_idle()

    # then
    record = shop.record()
    assert record.state is SagaState.COMPLETED
    assert record.input["card"] == MARK
    assert shop.step("shop.charge").args == (MARK, 30)
    assert shop.step("shop.charge").result == {"charge": f"ch-{MARK}"}
    assert MARK not in _bodies(store)
    assert "shop.charge" in _bodies(store)  # names, ids and states stay in clear


def test_a_saga_compensates_with_the_arguments_and_results_it_sealed(shop: Shop,
                                                                      store: MemoryStore) -> None:
    # given
    shop.script.then("ship", StepNotCommitted("out_of_stock"))

    # when
    shop.start_order(card=MARK)
    shop.driver.run_until_idle()

    # then
    assert shop.record().state is SagaState.COMPENSATED
    [refund] = shop.script.of("refund")
    assert refund.args == (MARK, 30)
    assert refund.kwargs["result"] == {"charge": f"ch-{MARK}"}
    assert MARK not in _bodies(store)


def test_a_new_key_listed_first_reads_old_sagas_and_seals_new_writes(shop: Shop, store: MemoryStore,
                                                                     clock: FrozenClock) -> None:
    # given: a saga half done under the old key
    shop.start_order(card=MARK)
    shop.deliver_next()  # reserve

    # when: the next process lists the new key first and finishes it
    rotated, rotated_shop = _other(store, clock, [NEW_KEY, OLD_KEY])
    for message in shop.driver.take():
        rotated_shop.driver.deliver(message)
    rotated_shop.driver.run_until_idle()

    # then: done, and the last write is sealed with the new key alone
    assert rotated.engine.load("o-1").state is SagaState.COMPLETED
    new_only, _ = _other(store, clock, [NEW_KEY])
    assert new_only.engine.load("o-1").input["card"] == MARK
    with pytest.raises(UndecryptableRecord):
        shop.sagas.engine.load("o-1")


def test_a_record_sealed_with_a_removed_key_reads_as_encrypted(shop: Shop, store: MemoryStore,
                                                               clock: FrozenClock) -> None:
    # given
    shop.start_order(card=MARK)
    shop.driver.run_until_idle()
    new_only, _ = _other(store, clock, [NEW_KEY])

    # when
    record = new_only.get("o-1")

    # then: ids, states, names and codes are there; every payload is the sentinel
    assert record is not None and record.state is SagaState.COMPLETED
    assert record.input is ENCRYPTED
    charge = record.step("shop.charge")
    assert charge is not None and charge.state is StepState.COMMITTED
    assert (charge.args, charge.kwargs, charge.result) == (ENCRYPTED, ENCRYPTED, ENCRYPTED)
    assert str(record.input) == "<encrypted>"
    assert [r.saga_id for r in new_only.browse().records] == ["o-1"]
    assert new_only.wait("o-1", timeout=0).input is ENCRYPTED


def test_an_undecryptable_saga_is_a_finding_and_the_sweep_leaves_it_alone(
        shop: Shop, store: MemoryStore, clock: FrozenClock) -> None:
    # given: a saga waiting on its second step, then a process that lost the key
    shop.start_order(card=MARK)
    shop.deliver_next()
    shop.driver.take()  # the charge message is lost
    before = store.get("saga", "o-1")
    new_only, new_shop = _other(store, clock, [NEW_KEY])

    # when
    report = new_shop.sweep_when_stale()
    findings = new_only.all_findings()

    # then
    reported = [*report.findings, *map(corrupt_finding, report.corrupt)]
    assert [(str(f.kind), f.record_id) for f in reported] == [("undecryptable", "o-1")]
    assert [(str(f.kind), f.record_id) for f in findings] == [("undecryptable", "o-1")]
    assert new_shop.driver.take() == []
    assert store.get("saga", "o-1") == before
    with pytest.raises(UndecryptableRecord):
        new_only.cancel("o-1")
    assert store.get("saga", "o-1") == before


def test_a_step_delivered_to_a_process_without_the_key_never_runs_its_body_nor_keeps_a_claim(
        shop: Shop, store: MemoryStore, clock: FrozenClock, caplog: pytest.LogCaptureFixture) -> None:
    # given
    shop.start_order(card=MARK)
    [message] = shop.driver.take()
    before = store.get("saga", "o-1")
    _, new_shop = _other(store, clock, [NEW_KEY])

    # when
    with caplog.at_level(logging.ERROR, logger="celery_sagas.execution"):
        new_shop.driver.deliver(message)

    # then: the body never ran, and the blind claim was taken back (docs/design.md §7): a
    # withdrawal note follows the claim note, the body is as it was, the step unclaimed; the
    # log says why
    assert new_shop.script.calls == []
    after = store.get("saga", "o-1")
    assert after is not None and before is not None
    assert (after.body, after.state, len(after.notes)) == (before.body, before.state, 2)
    assert after.version == before.version + 2
    assert shop.step("shop.reserve").started_at_ms is None
    assert shop.step("shop.reserve").claimed_by is None
    assert shop.step("shop.reserve").attempts == 0
    assert any("undecryptable" in r.getMessage() for r in caplog.records)
    assert new_shop.driver.take() == []


class _SiblingFirst(StoreProxy):
    """A store whose first claim note is followed at once by another process's note (a
    parallel sibling's claim would do the same): the record moves on before the claimer can
    take its claim back."""

    def __init__(self, inner: MemoryStore, sibling: Callable[[], object]) -> None:
        super().__init__(inner)
        self.sibling: Callable[[], object] | None = sibling

    def annotate(self, kind: str, record_id: str, note: str, *,
                 expected_version: int | None = None) -> Envelope | None:
        noted = super().annotate(kind, record_id, note, expected_version=expected_version)
        if self.sibling is not None and '"claim"' in note:
            self.sibling, sibling = None, self.sibling
            sibling()
        return noted


def test_a_keyless_claim_is_taken_back_after_the_record_moved_on_and_nothing_goes_to_review(
        shop: Shop, store: MemoryStore, clock: FrozenClock) -> None:
    # given: a keyless worker whose claim is followed at once by a keyed process's note
    shop.start_order(card=MARK)
    [message] = shop.driver.take()
    racing = _SiblingFirst(store, lambda: shop.sagas.signal("o-1", "nudge", 1))
    _, keyless = _other(racing, clock, [NEW_KEY])

    # when: it claims, cannot read, takes its claim back; a keyed process sweeps later
    keyless.driver.deliver(message)
    noted = store.get("saga", "o-1")
    reserve = shop.step("shop.reserve")
    shop.sweep_when_stale()
    shop.driver.run_until_idle()

    # then: the claim was taken back behind the other note, which is kept; the saga completed
    # with reserve run once and nothing sent to review
    assert noted is not None and len(noted.notes) == 3
    assert (reserve.started_at_ms, reserve.claimed_by, reserve.attempts) == (None, None, 0)
    record = shop.record()
    assert record.state is SagaState.COMPLETED
    assert [s.name for s in record.signals] == ["nudge"]
    assert shop.script.names().count("reserve") == 1
    assert shop.step("shop.reserve").attempts == 1


class _LostWithdrawalReply(StoreProxy):
    """A store that appends the first withdrawal note but loses its reply (a blip)."""

    lost = False

    def annotate(self, kind: str, record_id: str, note: str, *,
                 expected_version: int | None = None) -> Envelope | None:
        noted = super().annotate(kind, record_id, note, expected_version=expected_version)
        if '"withdraw"' in note and not self.lost:
            self.lost = True
            raise StoreError("connection reset")
        return noted


def test_a_withdrawal_whose_reply_was_lost_is_sent_again_and_counts_once(
        shop: Shop, store: MemoryStore, clock: FrozenClock) -> None:
    # given: a keyless worker whose store loses the reply of its first withdrawal
    shop.start_order(card=MARK)
    [message] = shop.driver.take()
    keyless, keyless_shop = _other(_LostWithdrawalReply(store), clock, [NEW_KEY])
    keyless.engine.repository._sleep = lambda seconds: None

    # when
    keyless_shop.driver.deliver(message)

    # then: the withdrawal was appended twice, and the step is unclaimed with no attempt counted
    noted = store.get("saga", "o-1")
    assert noted is not None and [n.split('"')[1] for n in noted.notes] == [
        "claim", "withdraw", "withdraw"]
    reserve = shop.step("shop.reserve")
    assert (reserve.started_at_ms, reserve.claimed_by, reserve.attempts) == (None, None, 0)
    assert keyless_shop.script.calls == []


def test_after_a_keyless_delivery_the_sweep_of_a_keyed_process_sends_the_step_again(
        shop: Shop, store: MemoryStore, clock: FrozenClock) -> None:
    # given: a worker without the key got reserve's message (key rotation under way)
    shop.start_order(card=MARK)
    [message] = shop.driver.take()
    _, keyless = _other(store, clock, [NEW_KEY])
    keyless.driver.deliver(message)

    # when: a process with the key sweeps once the step is stale
    shop.sweep_when_stale()
    shop.driver.run_until_idle()

    # then: the saga completed, reserve ran once, nothing went to review
    assert shop.record().state is SagaState.COMPLETED
    assert shop.script.names().count("reserve") == 1
    assert shop.step("shop.reserve").attempts == 1


def test_plain_records_written_before_encryption_still_read(store: MemoryStore,
                                                            clock: FrozenClock) -> None:
    # given: a saga written by a process without keys
    plain, plain_shop = _other(store, clock, [])
    plain_shop.start_order(card=MARK)
    plain_shop.deliver_next()
    assert MARK in _bodies(store)

    # when: a process with keys takes over
    sealed, sealed_shop = _other(store, clock, [OLD_KEY])
    for message in plain_shop.driver.take():
        sealed_shop.driver.deliver(message)
    sealed_shop.driver.run_until_idle()

    # then
    assert sealed.engine.load("o-1").state is SagaState.COMPLETED
    assert MARK not in _bodies(store)
    assert plain.get("o-1").input is ENCRYPTED  # type: ignore[union-attr]


def test_no_key_or_payload_reaches_a_log_line(shop: Shop, caplog: pytest.LogCaptureFixture) -> None:
    # given
    caplog.set_level(logging.DEBUG)
    shop.script.then("ship", StepNotCommitted("out_of_stock"))

    # when
    shop.start_order(card=MARK)
    shop.driver.run_until_idle()
    shop.sweep_when_stale()

    # then
    text = "\n".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    assert caplog.records
    assert MARK not in text and OLD_KEY.decode() not in text
    assert OLD_KEY.decode() not in repr(shop.sagas.settings)
    assert OLD_KEY.decode() not in repr(shop.sagas.engine.repository.codec)


def test_an_undecryptable_saga_due_and_stale_is_reported_once_per_sweep(
        shop: Shop, store: MemoryStore, clock: FrozenClock) -> None:
    # given: a retry waiting for its time (due) in a saga nobody touched since (stale)
    shop.script.then("sync", ConnectionError("reset"))
    shop.sync_user.start({"user": MARK}, saga_id="u-1")
    shop.driver.run_until_idle()
    assert shop.sagas.engine.load("u-1").steps[0].next_attempt_at_ms is not None
    new_only, new_shop = _other(store, clock, [NEW_KEY])
    reported: list[object] = []
    new_only.subscribe_findings(reported.append)

    # when
    clock.advance(SYNC_BACKOFF_MS)
    new_shop.sweep_when_stale()

    # then
    assert [(e.kind, e.record_id) for e in reported] == [("undecryptable", "u-1")]  # type: ignore[attr-defined]


# ---------------------------------------------------------------- resealing after a rotation


def test_reseal_rewrites_old_seals_under_the_newest_key_keeping_the_age(
        shop: Shop, store: MemoryStore, clock: FrozenClock) -> None:
    # given: a finished saga sealed with the old key, read by a process that rotated
    shop.start_order(card=MARK)
    shop.driver.run_until_idle()
    before = shop.record()
    rotated, _ = _other(store, clock, [NEW_KEY, OLD_KEY])

    # when
    first = rotated.reseal()
    again = rotated.reseal()

    # then: rewritten once, one version up, same age; the new key alone reads it
    assert (first.resealed, first.current, first.unreadable, first.cursor) == (1, 0, (), None)
    assert (again.resealed, again.current) == (0, 1)
    new_only, _ = _other(store, clock, [NEW_KEY])
    after = new_only.engine.load("o-1")
    assert after == replace(before, version=before.version + 1)
    assert MARK not in _bodies(store)


def test_reseal_encrypts_sagas_written_before_encryption_was_on(store: MemoryStore,
                                                                clock: FrozenClock) -> None:
    # given
    _, plain_shop = _other(store, clock, [])
    plain_shop.start_order(card=MARK)
    assert MARK in _bodies(store)
    sealed, _ = _other(store, clock, [OLD_KEY])

    # when
    page = sealed.reseal(states=["running"])

    # then
    assert page.resealed == 1 and MARK not in _bodies(store)


def test_reseal_pages_through_every_state_and_names_what_it_cannot_read(
        shop: Shop, store: MemoryStore, clock: FrozenClock) -> None:
    # given: three sagas under the old key, one under a key nobody lists any more
    for n in range(3):
        shop.start_order(f"o-{n}", card=MARK)
    shop.driver.run_until_idle()
    _, lost_shop = _other(store, clock, [Fernet.generate_key()])
    lost_shop.start_order("lost", card=MARK)
    rotated, _ = _other(store, clock, [NEW_KEY, OLD_KEY])

    # when
    pages, cursor = [], None
    while True:
        page = rotated.reseal(cursor=cursor, limit=1)
        pages.append(page)
        cursor = page.cursor
        if cursor is None:
            break

    # then
    assert sum(p.resealed for p in pages) == 3
    assert [i for p in pages for i in p.unreadable] == ["lost"]


def test_reseal_needs_keys(sagas: Sagas, store: MemoryStore, clock: FrozenClock) -> None:
    # given
    keyless, _ = _other(store, clock, [])

    # then
    with pytest.raises(SagaConfigurationError):
        keyless.reseal()
