"""Payload encryption at rest (docs/design.md §7): the codec seals every payload of a saga record
into one Fernet token, reads it back with any listed key, and tells an undecryptable record
(intact, to show as ``ENCRYPTED``) from a corrupt one; keys are checked when ``Sagas`` is made
and never shown by repr, ``celery report`` or the CLI."""

from __future__ import annotations

import builtins
import json
import os
import subprocess
import sys
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from cryptography.fernet import Fernet

from celery_sagas import ENCRYPTED, FindingKind, MemoryStore, Sagas
from celery_sagas._codec import Codec
from celery_sagas._crypto import Sealer
from celery_sagas._records import SagaState
from celery_sagas._scans import Scans
from celery_sagas.errors import (
    InvalidRecordError,
    PayloadTooLarge,
    SagaConfigurationError,
    UndecryptableRecord,
)
from celery_sagas.testing import FrozenClock
from celery_sagas.testing.driver import SagaDriver
from tests.engine.conftest import Script, register_shop

from .protocol_builders import CM, X0, saga, step

MARK = "MARKER-c0ffee"
KEY_A = Fernet.generate_key()
KEY_B = Fernet.generate_key()
ROOT = Path(__file__).resolve().parents[2]


def record() -> Any:
    """A saga with a payload in every field encryption covers (one step has no result yet)."""
    done = replace(step(CM, "charge"), args=(MARK, 30), kwargs={"card": MARK},
                   result={"charge": MARK})
    running = replace(step(X0, "ship"), args=(MARK,))
    return replace(saga(done, running), input={"card": MARK})


def sealed_body(codec: Codec) -> dict[str, Any]:
    return json.loads(codec.saga_envelope(record()).body)


# ---------------------------------------------------------------- the codec


def test_sealed_bodies_hold_no_payload_but_every_id_state_and_name() -> None:
    # when
    envelope = Codec(encryption_keys=[KEY_A]).saga_envelope(record(), stamp=True)

    # then
    assert MARK not in envelope.body
    body = json.loads(envelope.body)
    assert body["input"] is None and isinstance(body["sealed"], str)
    assert [(s["name"], s["state"], s["args"], s["kwargs"]) for s in body["steps"]] == [
        ("charge", "committed", None, None), ("ship", "executing", None, None)]
    assert body["steps"][0]["result"] is None and "result" not in body["steps"][1]


def test_a_sealed_record_reads_back_equal_with_any_listed_key() -> None:
    # given
    envelope = Codec(encryption_keys=[KEY_A]).saga_envelope(record())

    # then
    assert Codec(encryption_keys=[KEY_A]).saga(envelope, record().saga_id) == record()
    assert Codec(encryption_keys=[KEY_B, KEY_A]).saga(envelope, record().saga_id) == record()


def test_the_newest_key_seals() -> None:
    # given
    envelope = Codec(encryption_keys=[KEY_B, KEY_A]).saga_envelope(record())

    # then
    assert Codec(encryption_keys=[KEY_B]).saga(envelope, record().saga_id) == record()
    with pytest.raises(UndecryptableRecord):
        Codec(encryption_keys=[KEY_A]).saga(envelope, record().saga_id)


@pytest.mark.parametrize("keys", [[], [KEY_B]], ids=["no keys", "another key"])
def test_a_record_no_listed_key_opens_is_undecryptable_never_corrupt(keys: list[bytes]) -> None:
    # given
    envelope = Codec(encryption_keys=[KEY_A]).saga_envelope(record())

    # when
    with pytest.raises(UndecryptableRecord) as raised:
        Codec(encryption_keys=keys).saga(envelope, record().saga_id)

    # then
    assert not isinstance(raised.value, InvalidRecordError)
    assert (raised.value.kind, raised.value.record_id) == ("saga", record().saga_id)


@pytest.mark.parametrize("keys", [[], [KEY_B]], ids=["no keys", "another key"])
def test_read_for_display_each_sealed_payload_is_the_encrypted_sentinel(keys: list[bytes]) -> None:
    # given
    envelope = Codec(encryption_keys=[KEY_A]).saga_envelope(record())

    # when
    shown = Codec(encryption_keys=keys).saga(envelope, record().saga_id, display=True)

    # then: everything in clear is there; each payload that was set is ENCRYPTED
    charge, ship = shown.steps
    assert shown.input is ENCRYPTED
    assert (charge.args, charge.kwargs, charge.result) == (ENCRYPTED, ENCRYPTED, ENCRYPTED)
    assert (ship.args, ship.kwargs, ship.result) == (ENCRYPTED, ENCRYPTED, None)
    assert replace(shown, input=record().input, steps=record().steps) == record()
    assert str(ENCRYPTED) == "<encrypted>"


def test_plain_records_read_the_same_with_or_without_keys() -> None:
    # given
    envelope = Codec().saga_envelope(record())

    # then
    assert MARK in envelope.body
    assert Codec(encryption_keys=[KEY_A]).saga(envelope, record().saga_id) == record()


def test_a_record_without_payloads_is_not_sealed() -> None:
    # given
    bare = replace(record(), input=None, steps=())

    # when
    envelope = Codec(encryption_keys=[KEY_A]).saga_envelope(bare)

    # then
    assert "sealed" not in json.loads(envelope.body)
    assert Codec().saga(envelope, bare.saga_id) == bare


@pytest.mark.parametrize("change", [
    lambda body: {**body, "sealed": 42},
    lambda body: {**body, "input": None, "sealed": Fernet(KEY_A).encrypt(b"[1]").decode()},
    lambda body: {**body, "sealed": Fernet(KEY_A).encrypt(b"not json").decode()},
], ids=["token not a string", "payload count off", "payloads not JSON"])
def test_a_sealed_record_whose_token_does_not_fit_its_body_is_corrupt(change: Any) -> None:
    # given
    codec = Codec(encryption_keys=[KEY_A])
    body = change(sealed_body(codec))
    envelope = replace(codec.saga_envelope(record()), body=json.dumps(body))

    # then
    with pytest.raises(InvalidRecordError):
        codec.saga(envelope, record().saga_id)


def test_the_payload_limit_bounds_the_plain_record_not_the_sealed_one() -> None:
    # given: a record just under the limit in clear (sealed it is about a third larger)
    codec = Codec(2048, encryption_keys=[KEY_A])
    size = len(Codec(2048).saga_envelope(replace(record(), input="")).body)
    near = replace(record(), input="x" * (2048 - size - 10))

    # when
    envelope = codec.saga_envelope(near, stamp=True)

    # then
    assert len(envelope.body) > 2048
    assert codec.saga(envelope, near.saga_id) == near
    with pytest.raises(PayloadTooLarge):
        codec.saga_envelope(replace(near, input="x" * 2048))


def test_scans_report_an_undecryptable_saga_apart_or_show_it_for_display() -> None:
    # given
    store = MemoryStore()
    store.create(Codec(encryption_keys=[KEY_A]).saga_envelope(record()))
    codec = Codec(encryption_keys=[KEY_B])

    # when
    acting = Scans(store, codec).sagas([SagaState.RUNNING])
    shown = Scans(store, codec, display=True).sagas([SagaState.RUNNING])

    # then
    assert acting.records == ()
    [corrupt] = acting.corrupt
    assert corrupt.undecryptable and corrupt.id == record().saga_id
    from celery_sagas._findings import corrupt_finding

    assert corrupt_finding(corrupt).kind is FindingKind.UNDECRYPTABLE
    assert [r.input for r in shown.records] == [ENCRYPTED] and shown.corrupt == ()


def test_a_payload_kept_outside_a_body_is_sealed_the_same_way() -> None:
    # given: what a signal note would carry
    sealed = Codec(encryption_keys=[KEY_A]).payload_out({"tracking": MARK})
    plain = Codec().payload_out({"tracking": MARK})

    # then
    assert MARK not in json.dumps(sealed) and MARK in json.dumps(plain)
    for codec in (Codec(encryption_keys=[KEY_B, KEY_A]), Codec(encryption_keys=[KEY_A])):
        assert codec.payload_in(sealed, kind="saga", record_id="s") == {"tracking": MARK}
    assert Codec(encryption_keys=[KEY_B]).payload_in(plain, kind="saga", record_id="s") == {
        "tracking": MARK}
    with pytest.raises(UndecryptableRecord):
        Codec(encryption_keys=[KEY_B]).payload_in(sealed, kind="saga", record_id="s")
    assert Codec().payload_in(sealed, kind="saga", record_id="s", display=True) is ENCRYPTED
    with pytest.raises(InvalidRecordError):
        Codec().payload_in({"sealed": 1}, kind="saga", record_id="s")


def test_the_sentinel_and_the_error_survive_pickling_and_copying() -> None:
    import copy
    import pickle

    # given
    error = UndecryptableRecord(kind="saga", record_id="o-1")

    # then
    assert pickle.loads(pickle.dumps(ENCRYPTED)) is ENCRYPTED
    assert copy.deepcopy({"x": [ENCRYPTED]})["x"][0] is ENCRYPTED
    back = pickle.loads(pickle.dumps(error))
    assert (type(back), back.kind, back.record_id, str(back)) == (
        UndecryptableRecord, "saga", "o-1", "saga 'o-1' was encrypted with a key not in encryption_keys")


# ---------------------------------------------------------------- keys


@pytest.mark.parametrize("keys", [
    KEY_A.decode(), [b"short"], ["x" * 44], [KEY_A, 7], [],
], ids=["a single string", "too short", "not base64 of 32 bytes", "not a str", "empty list"])
def test_an_unusable_key_list_is_refused_when_sagas_is_made_and_never_echoed(keys: Any) -> None:
    # given
    app = Celery(f"keys-{uuid.uuid4().hex[:6]}", set_as_current=False)

    # when
    if keys == []:
        sagas = Sagas(app, store=MemoryStore(), allow_non_durable=True, encryption_keys=keys)
        assert sagas.settings.encryption_keys == ()  # an empty list is encryption off
        return
    with pytest.raises(SagaConfigurationError) as raised:
        Sagas(app, store=MemoryStore(), allow_non_durable=True, encryption_keys=keys)

    # then
    text = f"{raised.value} {raised.value!r} {raised.value.__cause__!r}"
    assert "encryption_keys" in text
    assert KEY_A.decode() not in text and "xxxxxxxx" not in text and "short" not in text


def test_keys_in_app_conf_are_read_and_hidden_from_repr() -> None:
    # given
    app = Celery(f"keys-{uuid.uuid4().hex[:6]}", set_as_current=False)
    app.conf.sagas_encryption_keys = [KEY_B.decode(), KEY_A.decode()]

    # when
    sagas = Sagas(app, store=MemoryStore(), allow_non_durable=True)

    # then
    assert sagas.settings.encryption_keys == (KEY_B.decode(), KEY_A.decode())
    shown = f"{sagas.settings!r} {sagas.engine.repository.codec!r} {Sealer([KEY_A])!r}"
    assert KEY_A.decode() not in shown and KEY_B.decode() not in shown
    assert "encryption_keys=<hidden>" in shown


def test_keys_without_the_crypto_extra_are_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # given: cryptography cannot be imported
    real_import = builtins.__import__

    def no_cryptography(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("cryptography"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_cryptography)
    app = Celery(f"keys-{uuid.uuid4().hex[:6]}", set_as_current=False)

    # then
    with pytest.raises(SagaConfigurationError, match=r"celery-sagas\[crypto\]"):
        Sagas(app, store=MemoryStore(), allow_non_durable=True, encryption_keys=[KEY_A])


# ---------------------------------------------------------------- the CLI and celery report


def test_show_prints_encrypted_for_payloads_no_key_opens(tmp_path: Path) -> None:
    from celery.bin.base import CLIContext
    from click.testing import CliRunner

    from celery_sagas.cli import sagas as sagas_command

    # given: a completed saga sealed with KEY_A, and an operator's app holding KEY_B only
    store, clock = MemoryStore(), FrozenClock()
    writer = Sagas(Celery(f"w-{uuid.uuid4().hex[:6]}", set_as_current=False), store=store,
                   allow_non_durable=True, clock=clock, encryption_keys=[KEY_A])
    register_shop(writer, Script())
    driver = SagaDriver(writer)
    writer.start("place-order", {"id": "o-1", "sku": MARK, "qty": 1, "card": MARK, "total": 3},
                 saga_id="o-1")
    driver.run_until_idle()
    reader_app = Celery(f"r-{uuid.uuid4().hex[:6]}", set_as_current=False)
    Sagas(reader_app, store=store, allow_non_durable=True, clock=clock, encryption_keys=[KEY_B])
    obj = CLIContext(app=reader_app, no_color=True, workdir=None)

    # when
    text = CliRunner().invoke(sagas_command, ["show", "o-1", "--payload"], obj=obj)
    as_json = CliRunner().invoke(sagas_command, ["show", "o-1", "--payload", "--json"], obj=obj)
    listed = CliRunner().invoke(sagas_command, ["list", "--json"], obj=obj)

    # then
    assert text.exit_code == 0, text.output
    assert "completed" in text.stdout and "input       <encrypted>" in text.stdout
    assert "args <encrypted>  kwargs <encrypted>" in text.stdout and MARK not in text.stdout
    assert as_json.exit_code == 0, as_json.output
    view = json.loads(as_json.stdout)
    assert view["input"] == "<encrypted>" and view["state"] == "completed"
    assert {(s["args"], s["kwargs"], s["result"]) for s in view["steps"]} == {
        ("<encrypted>", "<encrypted>", "<encrypted>")}
    assert listed.exit_code == 0 and [s["saga_id"] for s in json.loads(listed.stdout)["sagas"]] == ["o-1"]


def test_the_findings_report_tells_what_to_do_about_an_undecryptable_saga() -> None:
    from celery_sagas._cli_format import finding_hint, findings_text
    from celery_sagas._findings import corrupt_finding
    from celery_sagas._scans import CorruptRecord

    # given
    finding = corrupt_finding(CorruptRecord("saga", "o-1", "encrypted with a key not in "
                                            "encryption_keys", undecryptable=True))

    # then
    assert "list that key again" in finding_hint(finding)
    assert "undecryptable" in findings_text([finding], [])
    from celery_sagas.web._views import finding_forms, hint

    assert "list that key again" in hint(finding) and finding_forms(finding) == ()


APP_MODULE = '''
from celery import Celery
from celery_sagas import Sagas

app = Celery("report_app", broker="memory://")
app.conf.sagas_encryption_keys = [{conf_key!r}]
sagas = Sagas(app, store="memory://", allow_non_durable=True)
other = Sagas(Celery("kw", broker="memory://"), store="memory://", allow_non_durable=True,
              encryption_keys=[{kw_key!r}])
'''


def test_celery_report_of_a_real_app_shows_no_key(tmp_path: Path) -> None:
    # given: an app module with one key in app.conf and one passed to Sagas(...)
    module = f"report_app_{uuid.uuid4().hex[:6]}"
    (tmp_path / f"{module}.py").write_text(
        APP_MODULE.format(conf_key=KEY_A.decode(), kw_key=KEY_B.decode()))
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}

    # when
    result = subprocess.run([sys.executable, "-m", "celery", "-A", f"{module}:app", "report"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)

    # then
    assert result.returncode == 0, result.stderr
    assert "sagas_encryption_keys" in result.stdout
    for key in (KEY_A, KEY_B):
        assert key.decode() not in result.stdout + result.stderr


def test_the_reseal_command_walks_every_page_and_fails_on_what_it_cannot_read() -> None:
    from celery.bin.base import CLIContext
    from click.testing import CliRunner

    from celery_sagas.cli import sagas as sagas_command

    # given: three sagas sealed with KEY_A
    store = MemoryStore()
    writer = Sagas(Celery(f"w-{uuid.uuid4().hex[:6]}", broker="memory://",
                          set_as_current=False), store=store,
                   allow_non_durable=True, encryption_keys=[KEY_A])
    register_shop(writer, Script())
    for n in range(3):
        writer.start("place-order", {"id": f"o-{n}", "sku": MARK, "qty": 1, "card": MARK,
                                     "total": 3}, saga_id=f"o-{n}")

    def run(keys: list[bytes], *args: str) -> Any:
        app = Celery(f"r-{uuid.uuid4().hex[:6]}", set_as_current=False)
        Sagas(app, store=store, allow_non_durable=True, encryption_keys=keys)
        return CliRunner().invoke(sagas_command, ["reseal", *args, "--json"],
                                  obj=CLIContext(app=app, no_color=True, workdir=None))

    # when
    lost = run([KEY_B], "--limit", "1")
    rotated = run([KEY_B, KEY_A], "--all", "--limit", "2")
    after = run([KEY_B], "--all")

    # then
    assert lost.exit_code == 1 and json.loads(lost.stdout)["unreadable"] == ["o-0"]
    assert json.loads(lost.stdout)["cursor"] is not None
    assert rotated.exit_code == 0, rotated.output
    assert json.loads(rotated.stdout) == {"resealed": 3, "current": 0, "unreadable": [],
                                          "cursor": None}
    assert after.exit_code == 0 and json.loads(after.stdout)["current"] == 3
