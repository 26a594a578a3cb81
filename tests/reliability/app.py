"""The Celery app the reliability suite's workers run (``celery -A tests.reliability.app``).

Configured from ``REL_*`` environment variables set by the harness (``Config.environ``). The
saga ``rel-order`` reserves stock, charges a card and ships; its input carries a *plan* that
scripts how the fake providers behave for that saga (sleep in a body, decline, crash before or
after the provider applied the effect, fail transiently, keep the inventory service down while
a control file exists).

The fake providers keep a ledger (one JSON line per call, keyed by effect id):

- ``<op>.start``: a body began (effect id, attempt, saga, step, pid);
- ``<op>.done``: the provider applied the effect (for compensators: ``undoes`` names the
  execution effect id it reverses, taken from the step's committed result);
- ``<op>.dedup``: an idempotent provider saw an effect id it had already applied;
- ``<op>.fail``: the provider refused (nothing applied);
- ``refund.nothing``: the refund of a charge whose outcome was unknown (``charge_unknown``,
  declared ``compensate_unknown``) found the charge never applied: nothing to undo.

The options of issue 29 have their plans too: ``limited`` ({op: n}) answers ``RateLimited``
(a ``.fail`` line, nothing applied) to the first n attempts of ``charge_limited``, declared
``retry_on=(RateLimited,)`` with 3 retries (n = 4 runs them out: a known failure);
``fallback`` charges with ``charge``, and when it fails with a known outcome ``run`` catches
``StepFailed`` and charges with a backup (``charge_idem`` as step ``rel.charge-backup``);
``parallel_undo`` starts the saga under ``rel-order-parallel-undo``, whose compensators are
sent at once (``compensation="parallel"``).

Idempotent providers (``charge_idem``, the ``refund`` compensator) apply an effect id once:
an ``O_EXCL`` marker file per effect id is the provider's own deduplication table.

With ``REL_CLOCK_SKEW_MS`` set, the engine of that process reads a clock shifted by that many
milliseconds (clock-skew scenario); ``REL_ENCRYPTION_KEYS`` (comma-separated, newest first)
are its ``sagas_encryption_keys`` (key-rotation scenario). The store is a ``TracingStore`` so
lease grants and fenced writes land in the fence trace the invariant checker reads.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from celery import Celery

from celery_sagas import Sagas, SignalTimeout, StepFailed, StepNotCommitted
from tests.e2e.app import worker_app
from tests.reliability.recording import SkewedClock, TracingStore, append_line

DEFINITION = "rel-order"
INLINE_DEFINITION = "rel-order-inline"  # the same run, its steps inline (docs/design.md §3.2)
PARALLEL_UNDO_DEFINITION = "rel-order-parallel-undo"  # the same run, compensation="parallel"
CHILD_DEFINITION = "rel-payment"
STEP_NAMES = {
    "reserve": "rel.reserve", "charge": "rel.charge", "charge_idem": "rel.charge_idem",
    "charge_unknown": "rel.charge_unknown", "charge_limited": "rel.charge_limited",
    "ship": "rel.ship",
}
COMPENSATORS = {"release": "rel.release", "refund": "rel.refund"}
SECOND_RESERVE = "rel.reserve-b"  # the step name of the parallel branch's reservation
BACKUP_CHARGE = "rel.charge-backup"  # the step name of the charge run takes after StepFailed
# Provider ops whose repeated body run under one effect id would be a double side effect.
NON_IDEMPOTENT_STEPS = ("reserve", "charge", "charge_unknown", "charge_limited", "ship")
# Ops run again under one effect id only after a known failure (a ``.fail`` line): the
# non-idempotent compensator, and a step declared retry_on.
RETRIED_AFTER_A_KNOWN_FAILURE = ("release", "charge_limited")
IDEMPOTENT_STEPS = ("charge_idem",)
# Steps declared compensate_unknown: an unknown outcome of theirs is compensated, never
# reviewed (and their compensator tolerates nothing to undo).
COMPENSATE_UNKNOWN_STEPS = (STEP_NAMES["charge_unknown"],)


class RateLimited(Exception):
    """The provider answered 429 Too Many Requests: nothing was applied."""


def definition_for(plan: dict[str, Any]) -> str:
    """The definition a saga with ``plan`` is started under."""
    if plan.get("inline"):
        return INLINE_DEFINITION
    return PARALLEL_UNDO_DEFINITION if plan.get("parallel_undo") else DEFINITION


@dataclass(frozen=True)
class Config:
    """Where one run's processes, store, queue, ledger and traces live."""

    broker: str
    store: str
    prefix: str
    queue: str
    workdir: Path
    sweep_interval: float = 1.0
    stale_after: float = 1.5
    ambiguity_grace: float = 1.0
    time_limit: float = 10.0
    sweep_lease: float = 3.0
    sweep_page_size: int = 50
    sweep_shards: int = 1
    scan_delay_ms: int = 0
    clock_skew_ms: int = 0
    visibility_timeout: float = 3600.0
    encryption_keys: tuple[str, ...] = ()  # sagas_encryption_keys, newest first

    @property
    def ledger(self) -> Path:
        """The fake providers' ledger."""
        return self.workdir / "ledger.jsonl"

    @property
    def fences(self) -> Path:
        """The lease-grant and fenced-write trace."""
        return self.workdir / "fences.jsonl"

    @property
    def control(self) -> Path:
        """Files here switch provider behaviour (e.g. inventory down)."""
        return self.workdir / "control"

    @property
    def applied(self) -> Path:
        """The idempotent providers' deduplication table (one marker per effect id)."""
        return self.workdir / "applied"

    @classmethod
    def from_env(cls) -> Config:
        """The configuration a worker or beat process was started with."""
        env = os.environ
        return cls(
            broker=env["REL_BROKER"], store=env["REL_STORE"], prefix=env["REL_PREFIX"],
            queue=env["REL_QUEUE"], workdir=Path(env["REL_WORKDIR"]),
            sweep_interval=float(env["REL_SWEEP_INTERVAL"]),
            stale_after=float(env["REL_STALE_AFTER"]),
            ambiguity_grace=float(env["REL_GRACE"]), time_limit=float(env["REL_TIME_LIMIT"]),
            sweep_lease=float(env["REL_SWEEP_LEASE"]),
            sweep_page_size=int(env["REL_PAGE_SIZE"]),
            sweep_shards=int(env.get("REL_SWEEP_SHARDS", "1")),
            scan_delay_ms=int(env.get("REL_SCAN_DELAY_MS", "0")),
            clock_skew_ms=int(env.get("REL_CLOCK_SKEW_MS", "0")),
            visibility_timeout=float(env.get("REL_VISIBILITY_TIMEOUT", "3600")),
            encryption_keys=tuple(k for k in env.get("REL_ENCRYPTION_KEYS", "").split(",") if k),
        )

    def environ(self) -> dict[str, str]:
        """The environment that makes a spawned process use this configuration."""
        return {
            "REL_BROKER": self.broker, "REL_STORE": self.store, "REL_PREFIX": self.prefix,
            "REL_QUEUE": self.queue, "REL_WORKDIR": str(self.workdir),
            "REL_SWEEP_INTERVAL": str(self.sweep_interval),
            "REL_STALE_AFTER": str(self.stale_after), "REL_GRACE": str(self.ambiguity_grace),
            "REL_TIME_LIMIT": str(self.time_limit), "REL_SWEEP_LEASE": str(self.sweep_lease),
            "REL_PAGE_SIZE": str(self.sweep_page_size),
            "REL_SWEEP_SHARDS": str(self.sweep_shards),
            "REL_SCAN_DELAY_MS": str(self.scan_delay_ms),
            "REL_CLOCK_SKEW_MS": str(self.clock_skew_ms),
            "REL_VISIBILITY_TIMEOUT": str(self.visibility_timeout),
            "REL_ENCRYPTION_KEYS": ",".join(self.encryption_keys),  # Fernet keys hold no comma
        }


@dataclass
class Shop:
    """One built app: the Celery app, its Sagas and the saga definition."""

    app: Celery
    sagas: Sagas
    order: Any
    store: TracingStore


class Provider:
    """The fake inventory/payment/shipping providers: a ledger keyed by effect id."""

    def __init__(self, config: Config) -> None:
        self.config = config

    def record(self, op: str, ctx: Any, **extra: Any) -> None:
        """Append one ledger line for ``op`` under the effect id of ``ctx``."""
        append_line(self.config.ledger, {
            "op": op, "pid": os.getpid(), "t": time.time(), "saga_id": ctx.saga_id,
            "step": ctx.step, "effect_id": ctx.effect_id, "attempt": ctx.attempt, **extra,
        })

    def apply(self, op: str, ctx: Any, idempotent: bool, **extra: Any) -> None:
        """Apply the effect: once per effect id when ``idempotent``, else every call."""
        if idempotent:
            marker = self.config.applied / f"{op}-{ctx.effect_id}"
            try:
                os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            except FileExistsError:
                self.record(f"{op}.dedup", ctx, **extra)
                return
        self.record(f"{op}.done", ctx, **extra)

    def has_applied(self, effect_id: str) -> bool:
        """True when a step applied ``effect_id`` under a marker (``apply(idempotent=True)``)."""
        return any(self.config.applied.glob(f"*-{effect_id}"))

    def down(self, name: str | None) -> bool:
        """True while the control file ``name`` exists."""
        return name is not None and (self.config.control / name).exists()


def _pause(plan: dict[str, Any], op: str) -> None:
    delay = plan.get("sleep", {}).get(op, 0)
    if delay:
        time.sleep(delay / 1000)


def build(config: Config) -> Shop:
    """Build the reliability app for ``config`` (the harness builds one; workers use the env)."""
    # kombu restores unacked messages on a timer (10 s by default): with a short visibility
    # timeout, look as often as it expires so a redelivery happens while bodies run.
    app = worker_app("reliability", config.broker, config.queue, config.workdir,
                     visibility_timeout=config.visibility_timeout,
                     unacked_restore_interval=min(10.0, config.visibility_timeout),
                     unacked_restore_throttle=1)  # kombu 5.7+ scans only every Nth restore
    store = TracingStore(config.store, prefix=config.prefix, trace=config.fences,
                         scan_delay_ms=config.scan_delay_ms)
    clock = SkewedClock(config.clock_skew_ms) if config.clock_skew_ms else None
    sagas = Sagas(
        app, store=store, clock=clock, queue=config.queue,
        sweep_interval=config.sweep_interval, stale_after=config.stale_after,
        ambiguity_grace=config.ambiguity_grace, default_time_limit=config.time_limit,
        sweep_lease=config.sweep_lease, sweep_page_size=config.sweep_page_size,
        sweep_shards=config.sweep_shards, encryption_keys=list(config.encryption_keys),
    )
    provider = Provider(config)
    sweep = sagas.sweep

    def traced_sweep(**options: Any) -> Any:
        with store.sweeping():
            return sweep(**options)

    sagas.sweep = traced_sweep  # type: ignore[method-assign]

    def behave(op: str, plan: dict[str, Any], ctx: Any, idempotent: bool) -> dict[str, Any]:
        provider.record(f"{op}.start", ctx)
        _pause(plan, op)
        if ctx.attempt <= plan.get("limited", {}).get(op, 0):
            provider.record(f"{op}.fail", ctx)
            raise RateLimited("429 Too Many Requests")
        if plan.get("decline") == op:
            provider.record(f"{op}.fail", ctx)
            raise StepNotCommitted("declined")
        if plan.get("crash") == op:
            raise RuntimeError("provider timed out after the request left")
        if ctx.attempt <= plan.get("flaky", {}).get(op, 0):
            raise ConnectionError("transient")
        provider.apply(op, ctx, idempotent)
        if plan.get("crash_after") == op:
            raise RuntimeError("the connection dropped before the provider answered")
        return {"effect": ctx.effect_id}

    @sagas.step(compensate=COMPENSATORS["release"], name=STEP_NAMES["reserve"])
    def reserve(sku: str, plan: dict[str, Any], *, saga: Any = None) -> dict[str, Any]:
        """Reserve stock (not idempotent)."""
        return {**behave("reserve", plan, saga, False), "reservation": f"res-{sku}"}

    @sagas.compensator(name=COMPENSATORS["release"])
    def release(sku: str, plan: dict[str, Any], *, result: Any = None, saga: Any = None) -> None:
        """Release the reservation (not idempotent); fails while the inventory is down."""
        undoes = result["effect"]
        provider.record("release.start", saga, undoes=undoes)
        _pause(plan, "release")
        if provider.down(plan.get("inventory")) or saga.attempt <= plan.get("release_failures", 0):
            provider.record("release.fail", saga, undoes=undoes)
            raise ConnectionError("inventory service down")
        provider.apply("release", saga, False, undoes=undoes)

    @sagas.step(compensate=COMPENSATORS["refund"], name=STEP_NAMES["charge"])
    def charge(amount: int, plan: dict[str, Any], *, saga: Any = None) -> dict[str, Any]:
        """Charge the card (not idempotent)."""
        return {**behave("charge", plan, saga, False), "charged": amount}

    @sagas.step(compensate=COMPENSATORS["refund"], idempotent=True, retries=3,
                name=STEP_NAMES["charge_idem"])
    def charge_idem(amount: int, plan: dict[str, Any], *, saga: Any = None) -> dict[str, Any]:
        """Charge the card with an idempotency key the provider honours."""
        return {**behave("charge_idem", plan, saga, True), "charged": amount}

    @sagas.step(compensate=COMPENSATORS["refund"], compensate_unknown=True,
                name=STEP_NAMES["charge_unknown"])
    def charge_unknown(amount: int, plan: dict[str, Any], *, saga: Any = None) -> dict[str, Any]:
        """Charge the card; refunded even when the outcome is unknown (compensate_unknown)."""
        return {**behave("charge_unknown", plan, saga, True), "charged": amount}

    @sagas.step(compensate=COMPENSATORS["refund"], retry_on=(RateLimited,), retries=3,
                backoff=lambda attempt: 0.05 * attempt, name=STEP_NAMES["charge_limited"])
    def charge_limited(amount: int, plan: dict[str, Any], *, saga: Any = None) -> dict[str, Any]:
        """Charge the card with a provider that rate-limits (not idempotent; retry_on)."""
        return {**behave("charge_limited", plan, saga, False), "charged": amount}

    @sagas.compensator(name=COMPENSATORS["refund"], idempotent=True)
    def refund(amount: int, plan: dict[str, Any], *, result: Any = None, saga: Any = None) -> None:
        """Refund the charge by its effect id (idempotent: the provider dedupes by effect id);
        a charge whose outcome is unknown and that never happened has nothing to refund."""
        undoes = saga.forward_effect_id
        provider.record("refund.start", saga, undoes=undoes, outcome=saga.outcome)
        _pause(plan, "refund")
        if saga.outcome == "unknown" and not provider.has_applied(undoes):
            provider.record("refund.nothing", saga, undoes=undoes)
            return
        provider.apply("refund", saga, True, undoes=undoes)

    @sagas.step(compensate=None, name=STEP_NAMES["ship"])
    def ship(order_id: str, plan: dict[str, Any], *, saga: Any = None) -> dict[str, Any]:
        """Ship the order (nothing to undo; may decline)."""
        return behave("ship", plan, saga, False)

    @sagas.saga(CHILD_DEFINITION)
    def payment(ctx: Any, data: dict[str, Any]) -> Any:
        """The charge as a child saga of its own (plan ``child``)."""
        plan = data.get("plan", {})
        charge_task = charge_idem if plan.get("idempotent") else charge
        return ctx.step(charge_task, data["amount"], plan)

    def run_order(ctx: Any, data: dict[str, Any]) -> None:
        """Reserve, charge, ship; with ``parallel`` a second reservation runs beside the
        charge. The plan in the input scripts the providers; ``nap`` sleeps (ms, a durable
        timer) and ``signal`` waits for the signal "go" (``signal_timeout`` s, then goes on)
        after the reservation; ``child`` charges in a child saga; ``fallback`` charges with a
        backup when the charge fails (``StepFailed`` caught)."""
        plan = data.get("plan", {})
        ctx.step(reserve, data["sku"], plan)
        if plan.get("nap"):
            ctx.sleep(plan["nap"] / 1000)
        if plan.get("signal"):
            with contextlib.suppress(SignalTimeout):
                ctx.wait_signal("go", timeout=plan.get("signal_timeout"))
        charge_task = charge_idem if plan.get("idempotent") else charge
        charge_task = charge_unknown if plan.get("unknown") else charge_task
        charge_task = charge_limited if plan.get("limited") else charge_task
        if plan.get("fallback"):
            try:
                ctx.step(charge_task, data["amount"], plan)
            except StepFailed:
                ctx.step(charge_idem, data["amount"], plan, step_name=BACKUP_CHARGE)
            ctx.step(ship, data["id"], plan)
            return
        charging = (ctx.call_child(payment, {"amount": data["amount"], "plan": plan})
                    if plan.get("child") else ctx.call(charge_task, data["amount"], plan))
        if plan.get("parallel"):
            ctx.parallel(ctx.call(reserve, data["sku"] + "-b", plan, step_name=SECOND_RESERVE),
                         charging)
        else:
            ctx.parallel(charging)
        ctx.step(ship, data["id"], plan)

    order = sagas.saga(DEFINITION)(run_order)
    sagas.saga(INLINE_DEFINITION, inline=True)(run_order)
    sagas.saga(PARALLEL_UNDO_DEFINITION, compensation="parallel")(run_order)
    return Shop(app, sagas, order, store)


if os.environ.get("REL_BROKER"):
    app = build(Config.from_env()).app
