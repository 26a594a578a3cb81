"""Plans: how the fake providers behave for one saga (the ``plan`` in its input).

A plan factory takes the run's random generator and the saga's index and returns the plan;
``tests/reliability/app.py`` documents the keys.
"""

from __future__ import annotations

import random
from typing import Any

OPS = ("reserve", "charge", "charge_idem", "charge_unknown", "charge_limited", "ship", "release",
       "refund")


def mixed_plan(rng: random.Random, index: int) -> dict[str, Any]:
    """Mostly happy sagas; some idempotent, declined, crashing or flaky; one in five runs a
    second reservation in parallel with the charge."""
    plan: dict[str, Any] = {"sleep": {op: rng.randint(20, 120) for op in OPS},
                            "parallel": rng.random() < 0.2}
    roll = rng.random()
    if roll < 0.15:
        plan["idempotent"] = True
        if rng.random() < 0.5:
            plan["flaky"] = {"charge_idem": 1}
    elif roll < 0.30:
        plan["decline"] = "ship"
        plan["idempotent"] = rng.random() < 0.5
        plan["release_failures"] = rng.choice((0, 0, 1))
    elif roll < 0.35:
        plan["decline"] = "charge"
    elif roll < 0.38:
        plan["crash"] = "charge"
    elif roll < 0.41:
        plan["crash_after"] = "reserve"
    elif roll < 0.47:
        # a charge declared compensate_unknown: its unknown outcome is refunded, not reviewed
        plan["unknown"] = True
        plan["crash"] = rng.choice(("charge_unknown", None))
    return plan


def compensation_plan(rng: random.Random, index: int) -> dict[str, Any]:
    """Mostly sagas that compensate, with slow compensators (so kills land in them)."""
    plan: dict[str, Any] = {"sleep": {op: rng.randint(10, 40) for op in OPS},
                            "parallel": rng.random() < 0.3}
    plan["sleep"]["release"] = rng.randint(150, 400)
    plan["sleep"]["refund"] = rng.randint(150, 400)
    if rng.random() < 0.85:
        plan["decline"] = "ship"
    plan["idempotent"] = rng.random() < 0.5
    return plan


def slow_plan(rng: random.Random, index: int) -> dict[str, Any]:
    """Bodies that outlast a 1 s visibility timeout (so the broker delivers them again)."""
    plan = mixed_plan(rng, index)
    plan["sleep"].update({op: rng.randint(1200, 2200) for op in ("reserve", "charge", "charge_idem")})
    return plan


def hanging_plan(rng: random.Random, index: int) -> dict[str, Any]:
    """One saga in four hangs in its charge past a 2 s hard time limit."""
    if rng.random() < 0.25:
        return {"sleep": {"charge": 4000, "charge_idem": 4000}, "idempotent": rng.random() < 0.3}
    return mixed_plan(rng, index)


def waiting_plan(rng: random.Random, index: int) -> dict[str, Any]:
    """The mixed plans, with timers, signals and child sagas: one saga in four sleeps (a
    durable timer of 0.2-1.5 s), one in four waits for a signal (sent before or after the wait,
    each sent twice under one id, or never: a 1 s timeout taken as a path), one in three
    charges in a child saga."""
    plan = mixed_plan(rng, index)
    roll = rng.random()
    if roll < 0.25:
        plan["nap"] = rng.randint(200, 1500)
    elif roll < 0.5:
        plan["signal"] = rng.choice(("early", "late", "timeout"))
        if plan["signal"] == "timeout":
            plan["signal_timeout"] = 1.0
    if rng.random() < 0.33:
        plan["child"] = True
    return plan


def inline_plan(rng: random.Random, index: int) -> dict[str, Any]:
    """``mixed_plan`` for the saga whose steps run inline (``@sagas.saga(inline=True)``)."""
    return {**mixed_plan(rng, index), "inline": True}


def options_plan(rng: random.Random, index: int) -> dict[str, Any]:
    """``mixed_plan`` with issue 29's options: one saga in two compensates in parallel
    (``parallel_undo``); a quarter charge with a rate-limited provider (``retry_on``; 1 to 4
    refusals, 4 running out its 3 retries); a quarter catch a failed charge and charge a backup
    (``StepFailed``); one in six charges with a step declared ``compensate_unknown`` that often
    raises after it began; a third of the rest have the shipment declined (they compensate)."""
    plan = mixed_plan(rng, index)
    plan["parallel_undo"] = rng.random() < 0.5
    for key in ("idempotent", "unknown", "crash", "crash_after"):
        plan.pop(key, None)
    roll = rng.random()
    if roll < 0.25:
        plan["limited"] = {"charge_limited": rng.choice((1, 2, 3, 4))}
    elif roll < 0.5:
        plan.update(fallback=True, parallel=False,
                    decline=rng.choice(("charge", "charge", "ship", None)))
    elif roll < 0.67:
        plan.update(unknown=True, crash=rng.choice(("charge_unknown", "charge_unknown", None)))
    if "decline" not in plan and rng.random() < 0.33:
        plan["decline"] = "ship"
    return plan
