"""Records to envelopes and back (docs/design.md §2, §4.1): ``Codec(payload_limit)``.

The envelope carries what the store indexes (state, version, updated_at_ms, a saga's
definition as its label and its due time), the body everything else; reading back validates
every field and applies the record's notes; ``stamped`` makes two writers of one next record
send different bodies.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from celery_sagas._codec import Codec, carries_write, stamped
from celery_sagas._protocol.notes import ClaimNote
from celery_sagas._records import (
    APPROVAL,
    SAGA,
    ApprovalRecord,
    ApprovalState,
    SagaState,
    StepState,
)
from celery_sagas._values import decode_json
from celery_sagas.errors import InvalidRecordError, PayloadTooLarge, SagaValidationError
from celery_sagas.stores.base import Envelope

from .protocol_builders import CF, CM, X0, XR, saga, step

T0 = 1_700_000_000_000
CODEC = Codec()


def approval(**changes: Any) -> ApprovalRecord:
    record = ApprovalRecord("a1", "e1", "payments.refund", "t1", "alice", "ab" * 32,
                            ApprovalState.PENDING, T0, T0 + 60_000, T0, target="order-42",
                            saga_id="order-42", step="gate", nonce="n" * 22)
    return replace(record, **changes)


# ------------------------------------------------------------------ sagas


def test_a_saga_record_comes_back_equal() -> None:
    record = saga(step(CM, "a"), step(X0, "b"), version=7)
    assert CODEC.saga(CODEC.saga_envelope(record), "order-42") == record


TRACE_PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_a_saga_trace_parent_is_kept_in_clear_and_comes_back_equal() -> None:
    record = replace(saga(step(CM, "a")), trace_parent=TRACE_PARENT)
    envelope = CODEC.saga_envelope(record)
    assert json.loads(envelope.body)["trace_parent"] == TRACE_PARENT
    assert CODEC.saga(envelope, "order-42") == record
    assert "trace_parent" not in CODEC.saga_envelope(saga(step(CM, "a"))).body


@pytest.mark.parametrize("bad", ["00-xyz", TRACE_PARENT.upper(), TRACE_PARENT + "-extra", 7])
def test_a_malformed_trace_parent_makes_the_record_invalid(bad: Any) -> None:
    body = json.loads(CODEC.saga_envelope(saga(step(CM, "a"))).body)
    envelope = replace(CODEC.saga_envelope(saga(step(CM, "a"))),
                       body=json.dumps({**body, "trace_parent": bad}))
    with pytest.raises(InvalidRecordError):
        CODEC.saga(envelope, "order-42")


def test_the_envelope_carries_the_indexed_fields_and_the_body_the_rest() -> None:
    # given
    record = saga(step(XR, "a"), version=7)

    # when
    envelope = CODEC.saga_envelope(record)

    # then
    assert (envelope.kind, envelope.id, envelope.version, envelope.state, envelope.updated_at_ms) == (
        SAGA, "order-42", 7, "running", record.updated_at_ms)
    assert envelope.label == "place-order"
    assert envelope.due_at_ms == T0 + 5_000  # the released step's retry
    body = decode_json(envelope.body)
    assert not {"saga_id", "state", "version", "updated_at_ms"} & set(body)
    assert body["definition"] == "place-order" and body["steps"][0]["name"] == "a"


@pytest.mark.parametrize(("state", "steps", "due"), [
    (SagaState.RUNNING, (), None),
    (SagaState.COMPENSATING, ("cf",), T0 + 5_000),
    (SagaState.MANUAL_REVIEW, ("xr",), None),
    (SagaState.COMPLETED, ("cm",), None),
])
def test_only_a_live_saga_with_a_retry_waiting_is_due(state: SagaState, steps: tuple[str, ...],
                                                      due: int | None) -> None:
    variants = {"cf": CF, "xr": XR, "cm": CM}
    record = saga(*(step(variants[s], s) for s in steps), state=state)
    assert CODEC.saga_envelope(record).due_at_ms == due


def test_a_body_over_the_payload_limit_is_refused() -> None:
    small = Codec(payload_limit=1024)
    record = replace(saga(), input={"blob": "x" * 2_000})
    with pytest.raises(PayloadTooLarge):
        small.saga_envelope(record)
    assert CODEC.saga(CODEC.saga_envelope(record), "order-42") == record


def test_a_stamped_envelope_has_a_fresh_write_id_and_decodes_to_the_same_record() -> None:
    # given
    record = saga(step(CM, "a"))

    # when
    first, second = CODEC.saga_envelope(record, stamp=True), CODEC.saga_envelope(record, stamp=True)

    # then
    assert first.body != second.body
    assert decode_json(first.body)["write_id"] != decode_json(second.body)["write_id"]
    assert CODEC.saga(first, "order-42") == CODEC.saga(second, "order-42") == record


def test_a_stored_record_names_the_write_that_stored_it() -> None:
    record = saga(step(CM, "a"))
    envelope = CODEC.saga_envelope(record, stamp=True, write_id="0123456789abcdef")
    assert carries_write(envelope, "0123456789abcdef")
    assert carries_write(replace(envelope, notes=('{"claim":[]}',)), "0123456789abcdef")
    assert not carries_write(envelope, "fedcba9876543210")
    assert not carries_write(CODEC.saga_envelope(record, stamp=True), "0123456789abcdef")
    assert CODEC.saga(envelope, "order-42") == record


def test_stamped_keeps_a_canonical_body_and_refuses_what_is_no_json_object() -> None:
    plain = Envelope(SAGA, "s1", 1, "running", T0, "{}")
    assert json.loads(stamped(plain).body).keys() == {"write_id"}
    with pytest.raises(SagaValidationError):
        stamped(replace(plain, body="[]"))
    with pytest.raises(PayloadTooLarge):
        stamped(replace(plain, body='{"a":"' + "x" * 100 + '"}'), limit=64)


def test_a_claim_note_is_applied_when_the_record_is_read() -> None:
    # given: the record as created, with one claim note appended (the store bumped the version)
    record = saga(step(X0, "a"), version=1)
    note = ClaimNote("a", "fx-a", "worker-9", T0 + 50).text()
    envelope = replace(CODEC.saga_envelope(record), version=2, notes=(note,))

    # when
    read = CODEC.saga(envelope, "order-42")

    # then: claimed, at the envelope's version and time
    claimed = read.step("a")
    assert claimed is not None
    assert (claimed.state, claimed.attempts, claimed.claimed_by, claimed.started_at_ms) == (
        StepState.EXECUTING, 1, "worker-9", T0 + 50)
    assert (read.version, read.updated_at_ms) == (2, record.updated_at_ms)


@pytest.mark.parametrize("mangle", [
    lambda e: replace(e, body="not json {"),
    lambda e: replace(e, body='{"definition":"BAD NAME","created_at_ms":1,"steps":[]}'),
    lambda e: replace(e, body=e.body.replace('"effect_id":"fx-a"', '"effect_id":"has space"')),
    lambda e: replace(e, body=e.body.replace('"name":"b"', '"name":"a"')),  # a repeated step
    lambda e: replace(e, state="sleeping"),
    lambda e: replace(e, version=0),
    lambda e: replace(e, updated_at_ms=T0 - 1),  # before its creation
    lambda e: replace(e, kind=APPROVAL),
    lambda e: replace(e, id="another"),
    lambda e: replace(e, notes=('{"claim":["a"]}',)),
    lambda e: replace(e, notes=('{"comment":"hi"}',)),
    lambda e: replace(e, notes=('{"withdraw":["a","fx-a","w-1"]}',)),
    lambda e: replace(e, notes=('{"withdraw":["a","fx-a","w 1",1],"claim":[]}',)),
])
def test_a_saga_record_failing_read_validation_raises_invalid_record(mangle: Any) -> None:
    envelope = mangle(CODEC.saga_envelope(saga(step(CM, "a"), step(X0, "b"))))
    with pytest.raises(InvalidRecordError):
        CODEC.saga(envelope, "order-42")
    with pytest.raises(InvalidRecordError):
        CODEC.saga(None, "order-42")


# ------------------------------------------------------------------ approvals


def test_an_approval_record_comes_back_equal_with_its_token_hash_only() -> None:
    record = approval()
    envelope = CODEC.approval_envelope(record)
    assert (envelope.kind, envelope.id, envelope.state, envelope.label, envelope.due_at_ms) == (
        APPROVAL, "a1", "pending", None, None)
    assert CODEC.approval(envelope, "a1") == record
    assert decode_json(envelope.body)["token_hash"] == "ab" * 32


def test_a_stamped_approval_decodes_to_the_same_record() -> None:
    first = CODEC.approval_envelope(approval(), stamp=True)
    second = CODEC.approval_envelope(approval(), stamp=True)
    assert first.body != second.body
    assert CODEC.approval(first, "a1") == CODEC.approval(second, "a1") == approval()


@pytest.mark.parametrize(("field", "value"), [
    ("capability", "Bad Cap"), ("token_hash", "short"), ("expires_at_ms", "soon"),
    ("nonce", "bad nonce!"), ("tenant_id", None),
])
def test_an_approval_failing_read_validation_raises_invalid_record(field: str, value: Any) -> None:
    envelope = CODEC.approval_envelope(approval())
    body = decode_json(envelope.body)
    body[field] = value
    with pytest.raises(InvalidRecordError):
        CODEC.approval(replace(envelope, body=json.dumps(body)), "a1")
