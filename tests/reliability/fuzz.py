"""A hypothesis fuzz of every public input, on an in-process Sagas over a MemoryStore.

Inputs: saga ids, definition names and saga inputs (``start``), operator calls (``get``,
``cancel``, ``resume``), resolutions (outcome strings, step names, effect ids, results, error
codes), approval decisions and resume tokens, and ``sagas_*`` settings. The property for each
call: it either succeeds, or raises a documented error (``SagaError`` or a subclass, which
includes the ``ValueError`` validation errors) **and leaves the store exactly as it was**.

The targets (a saga in review with an ambiguous step, one with an ambiguous compensation, one
parked at an approval gate) are driven in-process with a recording dispatcher, so no broker
is needed; a call that legitimately changes one makes the next example build a fresh one.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from celery import Celery
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celery_sagas import MemoryStore, Sagas, StepNotCommitted
from celery_sagas._celery.settings import SETTING_DOCS
from celery_sagas._delivery import Delivery, DeliveryParts
from celery_sagas.errors import SagaError
from celery_sagas.testing.dispatcher import RecordingDispatcher
from tests.reliability.harness import Report
from tests.reliability.invariants import Violation

SECRET = b"k" * 32
DEFINITION = "fuzz-order"
GATED = "fuzz-gated"


class Undocumented(AssertionError):
    """A public call raised something that is not a SagaError, or stored on failure."""


def _snapshot(store: MemoryStore) -> tuple[Any, ...]:
    """Everything a MemoryStore keeps (records, indexes, leases, fences, cursors)."""
    return (dict(store._records), {k: list(v) for k, v in store._index.items()},
            dict(store._leases), dict(store._fences), dict(store._cursors))


@dataclass
class Target:
    """An in-process Sagas and the records the fuzz aims at."""

    sagas: Sagas
    store: MemoryStore
    ids: dict[str, str] = field(default_factory=dict)
    dirty: bool = False


def build_sagas(store: MemoryStore, **options: Any) -> Sagas:
    """A Sagas on ``store`` with a two-step saga and an approval-gated one."""
    app = Celery("fuzz", broker="memory://", set_as_current=False)
    settings = {"allow_non_durable": True, "approval_secrets": [SECRET], **options}
    sagas = Sagas(app, store=store, **settings)
    sagas.dispatcher = RecordingDispatcher()

    @sagas.step(compensate="fuzz.undo", name="fuzz.work")
    def work(n: int) -> dict[str, int]:
        return {"n": n}

    @sagas.compensator(name="fuzz.undo")
    def undo(n: int, *, result: Any = None) -> None:
        return None

    @sagas.saga(DEFINITION)
    def order(ctx: Any, data: Any) -> None:
        ctx.step(work, 1, step_name="first")
        ctx.step(work, 2, step_name="second")

    @sagas.saga(GATED)
    def gated(ctx: Any, data: Any) -> None:
        ctx.step(work, 1, step_name="first")
        ctx.approval("gate", capability="payments.refund", tenant_id="t1", principal_id="alice")
        ctx.step(work, 2, step_name="second")

    return sagas


def _raise(exc: BaseException) -> Callable[..., Any]:
    def body(*_: Any) -> Any:
        raise exc
    return body


def _ok(*_: Any) -> Any:
    return {"ok": True}


def _deliver(sagas: Sagas, saga_id: str, compensation: bool, body: Callable[..., Any]) -> None:
    engine = sagas.engine
    record = engine.load(saga_id)
    step = next(s for s in reversed(record.steps) if s.state in ("executing", "compensating"))
    if compensation:
        Delivery(DeliveryParts.of(engine), saga_id, step.name, step.compensation_effect_id, None,
                 compensation=True).run_compensation(body)
    else:
        Delivery(DeliveryParts.of(engine), saga_id, step.name, step.effect_id, None,
                 compensation=False).run_step(body)


def prepare() -> Target:
    """Fresh targets: review (ambiguous step), review (ambiguous compensation), a gate."""
    store = MemoryStore()
    sagas = build_sagas(store)
    target = Target(sagas, store)
    engine = sagas.engine
    engine.start(DEFINITION, {"n": 1}, "ambiguous")
    engine.advance("ambiguous")
    _deliver(sagas, "ambiguous", False, _ok)
    _deliver(sagas, "ambiguous", False, _raise(RuntimeError("unknown")))
    engine.start(DEFINITION, {"n": 2}, "comp")
    engine.advance("comp")
    _deliver(sagas, "comp", False, _ok)
    _deliver(sagas, "comp", False, _raise(StepNotCommitted("declined")))
    comp = engine.load("comp")
    first = comp.step("first")
    assert first is not None and first.state == "compensating"
    engine.repository.write(comp, _claimed_then_vanished(comp, engine.now()))
    engine.advance("comp")
    engine.start(GATED, {"n": 3}, "gated")
    engine.advance("gated")
    _deliver(sagas, "gated", False, _ok)
    for saga_id in ("ambiguous", "comp", "gated"):
        record = engine.load(saga_id)
        for step in record.steps:
            target.ids[f"{saga_id}:{step.name}:effect"] = step.effect_id
            target.ids[f"{saga_id}:{step.name}:comp"] = step.compensation_effect_id
            if step.approval_id:
                target.ids["approval"] = step.approval_id
    pending = sagas.approvals.pending("gated")
    target.ids["token"] = pending[0].token
    assert engine.load("ambiguous").state == "manual-review"
    assert engine.load("comp").state == "manual-review", engine.load("comp")
    return target


def _claimed_then_vanished(record: Any, now: int) -> Any:
    """The compensator of ``first`` claimed by a process that is long gone."""
    steps = tuple(
        replace(s, started_at_ms=now - 3_600_000, claimed_by="gone-host:1/x")
        if s.name == "first" else s for s in record.steps
    )
    return replace(record, steps=steps, version=record.version + 1)


_TARGET: list[Target] = []


def target() -> Target:
    """The shared targets, rebuilt after a call changed them."""
    if not _TARGET or _TARGET[0].dirty:
        _TARGET[:] = [prepare()]
    return _TARGET[0]


def attempt(store: MemoryStore, call: Callable[[], Any]) -> Any:
    """Run ``call``; a non-SagaError, or a SagaError that changed the store, is a finding."""
    before = _snapshot(store)
    try:
        return call()
    except SagaError:
        if _snapshot(store) != before:
            raise Undocumented("a call that raised left records behind") from None
        return None
    except Exception as exc:
        raise Undocumented(f"undocumented {type(exc).__name__}: {exc}") from exc


# ------------------------------------------------------------------ strategies

_json_leaf = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20))
_json = st.recursive(_json_leaf, lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
_junk = st.one_of(
    st.binary(max_size=16), st.sets(st.integers(), max_size=3), st.complex_numbers(),
    st.tuples(st.integers()), st.dictionaries(st.integers(), st.integers(), max_size=2),
    st.just(object()), st.just(math.nan), st.just(math.inf), st.just(float("-inf")),
    st.integers(min_value=2**53, max_value=2**80), st.just([[[[[[[[1]]]]]]]] * 3),
    st.just("x" * 2_000_000),
)
_anything = st.one_of(_json, _junk)
_ids = st.one_of(
    st.text(max_size=140), st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E),
                                   min_size=1, max_size=200),
    st.integers(), st.none(), st.binary(max_size=8), st.just(""), st.just(" "), st.just("a b"),
    st.just("x" * 129), st.just("é"), st.just("ok-id"),
)
_codes = st.one_of(st.none(), st.sampled_from(["declined", "not_committed", "a.b-c_1"]),
                   st.text(max_size=70), st.integers())
_outcomes = st.one_of(
    st.sampled_from(["committed", "not-committed", "compensated", "not-compensated"]),
    st.text(max_size=20), st.none(), st.integers(), st.sampled_from(["COMMITTED", " committed"]),
)


def _pick(draw: Any, real: list[str]) -> Any:
    """A real id two times in three, anything else otherwise."""
    if draw(st.integers(0, 2)):
        return draw(st.sampled_from(real))
    return draw(_ids)


# ------------------------------------------------------------------ properties


@st.composite
def start_calls(draw: Any) -> tuple[Any, Any, Any]:
    """(definition, input, saga id) for ``start``."""
    definition = draw(st.one_of(st.sampled_from([DEFINITION, GATED]), _ids))
    data = draw(_anything)
    saga_id = draw(st.one_of(st.sampled_from(["ambiguous", "fresh-1"]), _ids))
    return definition, data, saga_id


def check_start(call: tuple[Any, Any, Any]) -> None:
    """``start`` stores the saga, or raises a SagaError and stores nothing."""
    definition, data, saga_id = call
    t = target()
    handle = attempt(t.store, lambda: t.sagas.start(definition, data, saga_id=saga_id))
    if handle is not None:
        stored = t.sagas.get(handle.saga_id)
        if stored is None or stored.definition != definition:
            raise Undocumented("start returned but the saga is not stored as given")
        t.dirty = True


@st.composite
def resolutions(draw: Any) -> tuple[Any, ...]:
    """(saga id, step, effect id, outcome, result, error code) for ``resolve``."""
    t = target()
    saga_id = _pick(draw, ["ambiguous", "comp", "gated"])
    step = _pick(draw, ["first", "second", "gate"])
    effect_id = _pick(draw, list(t.ids.values()))
    return (saga_id, step, effect_id, draw(_outcomes),
            draw(st.one_of(_json, _junk.filter(lambda v: not isinstance(v, str)))), draw(_codes))


def check_resolve(call: tuple[Any, ...]) -> None:
    """``resolve`` settles a real ambiguity, or raises a SagaError and changes nothing."""
    saga_id, step, effect_id, outcome, result, code = call
    t = target()
    done = attempt(t.store, lambda: t.sagas.resolve(saga_id, step, effect_id, outcome,
                                                    result=result, error_code=code))
    if done is not None:
        t.dirty = True


@st.composite
def operator_calls(draw: Any) -> tuple[str, Any]:
    """(operation, id) for get, cancel, resume, pending, approvals.get and all_findings."""
    op = draw(st.sampled_from(["get", "cancel", "resume", "pending", "approval", "all-findings"]))
    return op, _pick(draw, ["ambiguous", "comp", "gated", "missing"])


def check_operator(call: tuple[str, Any]) -> None:
    """Operator calls on any id: a SagaError or a result, never a stray write on failure."""
    op, saga_id = call
    t = target()
    actions: dict[str, Callable[[], Any]] = {
        "get": lambda: t.sagas.get(saga_id),
        "cancel": lambda: t.sagas.cancel(saga_id),
        "resume": lambda: t.sagas.resume(saga_id),
        "pending": lambda: t.sagas.approvals.pending(saga_id),
        "approval": lambda: t.sagas.approvals.get(saga_id),
        "all-findings": lambda: t.sagas.all_findings(saga_id),
    }
    before = _snapshot(t.store)
    try:
        actions[op]()
    except SagaError:
        if _snapshot(t.store) != before:
            raise Undocumented(f"{op} raised and left records behind") from None
        return
    except Exception as exc:
        raise Undocumented(f"{op}: undocumented {type(exc).__name__}: {exc}") from exc
    if _snapshot(t.store) != before:
        t.dirty = True


_MUTATIONS: list[Callable[[str, int, str], Any]] = [
    lambda t, i, c: t,
    lambda t, i, c: t + c,
    lambda t, i, c: t[:-1],
    lambda t, i, c: t.upper(),
    lambda t, i, c: t.replace(".", "", 1),
    lambda t, i, c: t * 20,
    lambda t, i, c: t.encode(),
    lambda t, i, c: t[: i % max(1, len(t))] + c + t[i % max(1, len(t)) + 1:],
    lambda t, i, c: None,
    lambda t, i, c: i,
    lambda t, i, c: c * i,
]


def _mutated(draw: Any, token: str) -> Any:
    """The real token, or one of many near misses and non-tokens."""
    mutate = draw(st.sampled_from(_MUTATIONS))
    return mutate(token, draw(st.integers(0, 400)), draw(st.characters()))


@st.composite
def approval_calls(draw: Any) -> tuple[Any, ...]:
    """A decide or a resume with arbitrary ids, decisions, tenants and tokens."""
    t = target()
    if draw(st.booleans()):
        return ("decide", _pick(draw, [t.ids["approval"]]), _pick(draw, ["t1"]),
                draw(st.one_of(st.sampled_from(["approved", "denied"]), _ids)),
                _pick(draw, ["bob"]))
    return ("resume", _pick(draw, ["gated", "ambiguous"]), _mutated(draw, t.ids["token"]),
            _pick(draw, ["t1"]), _pick(draw, ["alice"]))


def check_approval(call: tuple[Any, ...]) -> None:
    """Approval decisions and tokens: a SagaError and no write, or a legitimate change."""
    t = target()
    if call[0] == "decide":
        _, approval, tenant, decision, by = call
        done = attempt(t.store, lambda: t.sagas.approvals.decide(
            approval, tenant_id=tenant, decision=decision, decided_by=by))
    else:
        _, saga_id, token, tenant, principal = call
        done = attempt(t.store, lambda: t.sagas.approvals.resume(
            saga_id, token, tenant_id=tenant, principal_id=principal))
    if done is not None:
        t.dirty = True


_setting_values = st.one_of(
    st.sampled_from([math.inf, -math.inf, math.nan, 1e300, 2**63, 2**53, 0, -1, 1e-9, 0.5, 1024]),
    st.integers(-5, 10**6), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
    st.none(), st.text(max_size=20), st.lists(st.binary(max_size=40), max_size=3),
    st.just(1e300), st.just(2**63), st.just([b"x" * 32]), st.just(("s" * 40,)),
)


@st.composite
def setting_calls(draw: Any) -> dict[str, Any]:
    """Keyword settings for ``Sagas(...)`` (known names with any value, and unknown names)."""
    names = draw(st.lists(st.one_of(st.sampled_from(sorted(SETTING_DOCS)), st.text(max_size=10)),
                          min_size=1, max_size=3, unique=True))
    return {name: draw(_setting_values) for name in names if name not in ("store",)}


def check_settings(options: dict[str, Any]) -> None:
    """``Sagas(app, **settings)`` accepts or raises a SagaError; nothing is ever stored."""
    store = MemoryStore()

    def build_and_use() -> Any:
        sagas = build_sagas(store, **options)
        sagas.start(DEFINITION, {"n": 1}, saga_id="s1")
        return sagas.sweep()

    try:
        build_and_use()
    except SagaError:
        if store._records:
            raise Undocumented("settings refused after something was stored") from None
    except Exception as exc:
        raise Undocumented(f"settings {options!r}: undocumented {type(exc).__name__}: {exc}") from exc


@st.composite
def findings_calls(draw: Any) -> tuple[Any, Any, Any]:
    """(report, cursor, limit) for ``findings``, cursors taken from real pages and mangled."""
    t = target()
    first = t.sagas.findings("all", limit=1)
    real = first.cursor or "x"
    cursor = draw(st.one_of(st.none(), st.just(real), st.sampled_from(_MUTATIONS).map(
        lambda mutate: mutate(real, 7, "~")), _ids))
    report = draw(st.one_of(st.sampled_from(["all", "sagas", "effects"]), _ids))
    limit = draw(st.one_of(st.integers(-2, 1002), st.sampled_from([1, 100, 1000]), _durations))
    return report, cursor, limit


def check_findings(call: tuple[Any, Any, Any]) -> None:
    """``findings`` pages or refuses its arguments with a SagaError; it never writes."""
    report, cursor, limit = call
    t = target()
    before = _snapshot(t.store)
    try:
        t.sagas.findings(report, cursor=cursor, limit=limit)
    except SagaError:
        pass
    except Exception as exc:
        raise Undocumented(f"findings: undocumented {type(exc).__name__}: {exc}") from exc
    if _snapshot(t.store) != before:
        raise Undocumented("findings changed the store")


_durations = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, -1, -0.5, 0, 0.0, 0.01, 1e-9, True, 10**400]),
    st.floats(max_value=0.05), st.integers(max_value=0), st.none(), st.text(max_size=3),
)


@st.composite
def wait_calls(draw: Any) -> tuple[Any, Any, Any]:
    """(saga id, timeout, interval) for ``wait`` on a saga that will not settle by itself."""
    return _pick(draw, ["gated", "ambiguous"]), draw(_durations), draw(_durations)


def check_wait(call: tuple[Any, Any, Any]) -> None:
    """``wait`` returns, times out, or refuses its arguments; it never hangs on a bad one."""
    saga_id, timeout, interval = call
    t = target()
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            t.sagas.wait(saga_id, timeout=timeout, interval=interval)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(2.0)
    if thread.is_alive():
        raise Undocumented(f"wait(timeout={timeout!r}, interval={interval!r}) hangs")
    found = outcome[0]
    if found is not None and not isinstance(found, (SagaError, TimeoutError)):
        raise Undocumented(f"wait: undocumented {type(found).__name__}: {found}")


PROPERTIES: list[tuple[str, Any, Callable[[Any], None]]] = [
    ("start", start_calls(), check_start),
    ("resolve", resolutions(), check_resolve),
    ("operator", operator_calls(), check_operator),
    ("approval", approval_calls(), check_approval),
    ("settings", setting_calls(), check_settings),
    ("wait", wait_calls(), check_wait),
    ("findings", findings_calls(), check_findings),
]


def fuzz(strategy: Any, check: Callable[[Any], None], examples: int) -> None:
    """Run one property for ``examples`` examples (raises on the first finding, shrunk)."""

    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def prop(value: Any) -> None:
        check(value)

    prop()


def run_fuzz(examples: int) -> Report:
    """Every property at ``examples`` examples each, as a report (findings are violations)."""
    report = Report(f"hypothesis fuzz ({examples} examples per input kind)")
    for name, strategy, check in PROPERTIES:
        try:
            fuzz(strategy, check, examples)
        except Exception as exc:
            report.violations.append(Violation("fuzz", None, f"{name}: {exc}"))
        report.examples[name] += examples
    return report
