"""Payload encryption at rest on real workers (docs/design.md §7, docs/operations.md "Rotating
encryption keys"): with ``sagas_encryption_keys`` set, nothing a saga was given or returned is
in clear in Redis or PostgreSQL, sagas complete and compensate, a new key listed first keeps
old sagas readable across a worker restart, and once the old key is removed its records show
``<encrypted>`` and are reported ``undecryptable`` until the key is listed again and
``celery sagas reseal`` re-encrypts them; keys never reach ``celery inspect conf``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from cryptography.fernet import Fernet

from celery_sagas import ENCRYPTED
from tests.conftest import REDIS_BROKER_URL
from tests.e2e.app import build
from tests.e2e.conftest import ROOT, Stack, _make_stack, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MARK = "MARKER-5e41ed"
OLD = Fernet.generate_key().decode()
NEW = Fernet.generate_key().decode()
BIN = Path(sys.executable).parent


@pytest.fixture(params=["redis", "postgres"])
def sealed(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stack]:
    """Redis broker, a Redis or PostgreSQL store, payloads sealed with OLD."""
    store = request.getfixturevalue("redis_url" if request.param == "redis" else "postgres_url")
    yield from _make_stack(tmp_path, REDIS_BROKER_URL, store, encryption_keys=(OLD,))


@pytest.fixture
def sealed_redis(tmp_path: Path, redis_url: str) -> Iterator[Stack]:
    """Redis broker and store, payloads sealed with OLD."""
    yield from _make_stack(tmp_path, REDIS_BROKER_URL, redis_url, encryption_keys=(OLD,))


def raw_store(stack: Stack) -> str:
    """Everything the test's store holds, as text: every Redis value or every SQL row."""
    store = stack.sagas.store
    if hasattr(store, "layout"):
        client = store._client
        parts = []
        for key in client.scan_iter(match=store.layout.pattern(), count=1000):
            kind = client.type(key)
            kind = kind.decode() if isinstance(kind, bytes) else kind
            value: Any = {
                "string": client.get, "hash": client.hgetall, "set": client.smembers,
                "zset": lambda k: client.zrange(k, 0, -1, withscores=True),
                "list": lambda k: client.lrange(k, 0, -1),
            }.get(kind, lambda k: b"")(key)
            parts.append(f"{key!r} {value!r}")
        return "\n".join(parts)
    with store.engine.connect() as conn:
        return "\n".join(repr(tuple(row)) for table in store._tables.metadata.sorted_tables
                         for row in conn.execute(sa.select(table)))


def rekey(stack: Stack, *keys: str) -> None:
    """Stop every process, then rebuild the test's app with ``keys`` (workers started after
    this use them): the restart of a key rotation."""
    for process in stack.processes:
        process.stop()
    stack.sagas.store.close()
    stack.config = replace(stack.config, encryption_keys=keys)
    stack.shop = build(stack.config)


def order(stack: Stack, saga_id: str, **plan: Any) -> None:
    stack.shop.order.start({"sku": MARK, "amount": 7, "id": f"{saga_id}-{MARK}", "plan": plan},
                           saga_id=saga_id)


def cli(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    """`celery -A tests.e2e.app ARGS` with the test's configuration (and keys)."""
    env = {**os.environ, **stack.config.environ(), "PYTHONPATH": str(ROOT)}
    return subprocess.run([str(BIN / "celery"), "-A", "tests.e2e.app", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=90, check=False)


def test_no_payload_is_in_clear_in_the_store_and_sagas_complete_and_compensate(sealed: Stack) -> None:
    # given
    sealed.worker()

    # when
    order(sealed, "enc-done")
    order(sealed, "enc-undone", decline="ship")
    done = sealed.wait_settled("enc-done")
    undone = sealed.wait_settled("enc-undone")

    # then: both ran their course with the payloads they were given
    assert done.state == "completed"
    assert done.input["sku"] == MARK and done.steps[0].args[0] == MARK
    assert done.steps[0].result == {"reservation": f"res-{MARK}"}
    assert undone.state == "compensated"
    [release] = sealed.ops("release", "enc-undone")
    assert release["reservation"] == f"res-{MARK}"  # the compensator got the sealed result
    # and nothing of them is in clear in the store, while ids and states are
    raw = raw_store(sealed)
    assert "enc-done" in raw and "completed" in raw and "compensated" in raw
    assert MARK not in raw and "gAAAAA" in raw  # Fernet tokens
    # (the dump does see payloads: a saga started without keys is in clear, while no worker
    # runs to write it again sealed)
    for process in sealed.processes:
        process.stop()
    plain = build(replace(sealed.config, encryption_keys=()))
    try:
        plain.order.start({"sku": MARK, "amount": 1, "id": "p"}, saga_id="enc-plain")
        assert MARK in raw_store(sealed)
    finally:
        plain.sagas.store.close()


def test_a_rotation_keeps_old_sagas_readable_and_removing_the_old_key_reports_them(
        sealed_redis: Stack) -> None:
    stack = sealed_redis
    # given: under OLD, one saga completed, one in manual review, and one started while no
    # worker runs (its first step waits in the queue through the restart)
    stack.worker()
    order(stack, "rot-old")
    order(stack, "rot-review", crash="charge")
    assert stack.wait_settled("rot-old").state == "completed"
    assert stack.wait_settled("rot-review").state == "manual-review"
    for process in stack.processes:
        process.stop()
    order(stack, "rot-flight")

    # when: the new key is listed first and the workers restart
    rekey(stack, NEW, OLD)
    stack.worker()
    order(stack, "rot-new")

    # then: old sagas read, the one written under OLD finishes under NEW, new ones run
    assert stack.sagas.get("rot-old").input["sku"] == MARK
    assert stack.wait_settled("rot-new").state == "completed"
    flight = stack.wait_settled("rot-flight")
    assert flight.state == "completed", flight
    assert flight.steps[1].result == {"charged": 7}

    # when: the old key is removed
    rekey(stack, NEW)
    stack.worker()

    # then: a saga written under NEW alone still reads; one sealed with OLD shows <encrypted>
    assert stack.sagas.get("rot-new").input["sku"] == MARK
    assert stack.sagas.get("rot-flight").input["sku"] == MARK  # its last write was under NEW
    old = stack.sagas.get("rot-old")
    assert old is not None and old.state == "completed" and old.input is ENCRYPTED
    shown = cli(stack, "sagas", "show", "rot-old", "--payload")
    assert shown.returncode == 0, shown.stderr
    assert "input       <encrypted>" in shown.stdout and "Traceback" not in shown.stderr
    # and the one waiting for an operator is an undecryptable finding, never corrupt
    found = cli(stack, "sagas", "findings", "--json")
    assert found.returncode == 0, found.stderr
    kinds = {(f["kind"], f["record_id"]) for f in json.loads(found.stdout)["findings"]}
    assert ("undecryptable", "rot-review") in kinds
    assert not any(kind == "corrupt" for kind, _ in kinds)
    assert MARK not in raw_store(stack)

    # when: the old key is listed again (removed too early), and everything is resealed
    rekey(stack, NEW, OLD)
    assert stack.sagas.get("rot-old").input["sku"] == MARK
    resealed = cli(stack, "sagas", "reseal", "--all", "--json")
    assert resealed.returncode == 0, resealed.stderr
    assert json.loads(resealed.stdout)["unreadable"] == []
    rekey(stack, NEW)

    # then: with the new key alone, every saga reads and nothing is undecryptable
    for saga_id in ("rot-old", "rot-review", "rot-flight", "rot-new"):
        assert stack.sagas.get(saga_id).input["sku"] == MARK, saga_id
    found = cli(stack, "sagas", "findings", "--json")
    assert not any(f["kind"] == "undecryptable" for f in json.loads(found.stdout)["findings"])


def test_celery_inspect_conf_on_a_real_worker_shows_no_key(sealed_redis: Stack) -> None:
    # given
    process = sealed_redis.worker()

    # when
    # its reply ends the wait (without -d, every worker on the broker had 20 s to answer)
    inspected = cli(sealed_redis, "inspect", "conf", "--json", "-t", "20", "-d", process.name)
    reported = cli(sealed_redis, "report")

    # then
    assert inspected.returncode == 0, inspected.stderr
    assert "sagas_encryption_keys" in inspected.stdout
    for text in (inspected.stdout, inspected.stderr, reported.stdout, reported.stderr, process.text()):
        assert OLD not in text


def test_a_worker_without_the_key_leaves_no_claim_and_a_keyed_worker_carries_the_saga_on(
        sealed_redis: Stack) -> None:
    stack = sealed_redis
    # given: a saga sealed with OLD whose first step waits in the queue, and a key rotation
    # begun wrong: the only worker running lists NEW alone
    order(stack, "keyless")
    rekey(stack, NEW)
    keyless = stack.worker()

    # when: it receives the step
    wait_until(lambda: "undecryptable" in keyless.text(), timeout=60,
               what=f"the keyless worker to refuse the step\n{keyless.text()[-3000:]}")

    # then: no body ran, no claim is left (nothing ambiguous), and a process without the key
    # reports the saga as undecryptable
    assert stack.ops("reserve.start", "keyless") == []

    def reported() -> bool:
        found = cli(stack, "sagas", "findings", "--json")
        assert found.returncode == 0, found.stderr
        return ("undecryptable", "keyless") in {
            (f["kind"], f["record_id"]) for f in json.loads(found.stdout)["findings"]}

    wait_until(reported, timeout=60, what="an undecryptable finding once the saga is stale")
    rekey(stack, NEW, OLD)
    reserve = stack.sagas.get("keyless").steps[0]
    assert (reserve.state, reserve.attempts, reserve.started_at_ms) == ("executing", 0, None)

    # when: workers with the key run, with a beat (the sweep sends the step again)
    stack.worker()
    stack.beat()

    # then: the saga completes with every body run once, nothing sent to review
    record = stack.wait_settled("keyless")
    assert record.state == "completed", record
    assert len(stack.ops("reserve.start", "keyless")) == 1
    assert "worker_lost" not in keyless.text() and "time_limit" not in keyless.text()


def test_an_export_without_the_key_refuses_sealed_sagas_from_the_shell(
        sealed_redis: Stack, tmp_path: Path) -> None:
    # given: three sagas completed by a worker that seals with OLD, and an operator's shell
    # whose configuration lists no key (issue 25 item 9: export exited 0 writing "<encrypted>"
    # as data, an unwritable --output printed a traceback, --limit 2 exported every saga)
    stack = sealed_redis
    stack.worker()
    for n in range(3):
        order(stack, f"exp-{n}")
    for n in range(3):
        assert stack.wait_settled(f"exp-{n}").state == "completed"
    keyed = stack.config
    stack.config = replace(keyed, encryption_keys=())
    target = tmp_path / "out.jsonl"

    # when
    refused = cli(stack, "sagas", "export", "--output", str(target))
    unwritable = cli(stack, "sagas", "export", "--keep-sealed", "--output", "/proc/nope/x.jsonl")
    sealed = cli(stack, "sagas", "export", "--keep-sealed", "--limit", "2")
    stack.config = keyed
    opened = cli(stack, "sagas", "export", "--limit", "2")

    # then: refused naming the saga and the way out, no file written
    assert refused.returncode == 1, (refused.stdout, refused.stderr)
    assert "exp-" in refused.stderr and "--keep-sealed" in refused.stderr
    assert not target.exists() and "<encrypted>" not in refused.stdout
    # an unwritable path is a usage error, not a traceback
    assert unwritable.returncode == 2, (unwritable.stdout, unwritable.stderr)
    assert "--output" in unwritable.stderr and "Traceback" not in unwritable.stderr
    # kept sealed: two sagas in all, each its stored form under "sealed", no payload in clear
    assert sealed.returncode == 0, sealed.stderr
    lines = [json.loads(line) for line in sealed.stdout.splitlines()]
    assert len(lines) == 2 and all("input" not in line for line in lines)
    assert all(isinstance(line["sealed"]["body"]["sealed"], str) for line in lines)
    assert MARK not in sealed.stdout and "<encrypted>" not in sealed.stdout
    # with the key: two sagas, payloads opened
    assert opened.returncode == 0, opened.stderr
    lines = [json.loads(line) for line in opened.stdout.splitlines()]
    assert [line["input"]["sku"] for line in lines] == [MARK, MARK]
