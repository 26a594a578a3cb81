"""The effect state machine (SPEC §2.1) as a table and one function that consults it.

    admission --> executing --> committed
        |             |-------> failed      (provider proved nothing was committed)
        |             '-------> unknown     (began; outcome not known)
        '-------> failed                    (never began)

``committed`` and ``failed`` are final; ``unknown`` waits for an operator or a provider check,
which may settle it as committed or failed.
"""

from __future__ import annotations

from dataclasses import replace

from .._records import EffectRecord, EffectState
from .._values import error_code as check_error_code
from ..errors import IllegalTransition

__all__ = ["EFFECT_TRANSITIONS", "FINAL_EFFECT_STATES", "transition_effect"]

_A, _X, _C, _F, _U = (
    EffectState.ADMISSION,
    EffectState.EXECUTING,
    EffectState.COMMITTED,
    EffectState.FAILED,
    EffectState.UNKNOWN,
)

EFFECT_TRANSITIONS: dict[EffectState, frozenset[EffectState]] = {
    _A: frozenset({_X, _F}),
    _X: frozenset({_C, _F, _U}),
    _U: frozenset({_C, _F}),
    _C: frozenset(),
    _F: frozenset(),
}

FINAL_EFFECT_STATES = frozenset({_C, _F})


def transition_effect(
    record: EffectRecord, to: EffectState, now_ms: int, error_code: str | None = None
) -> EffectRecord:
    """Return the record moved to ``to`` (version + 1); raise IllegalTransition otherwise."""
    if to not in EFFECT_TRANSITIONS[record.state]:
        raise IllegalTransition(state=str(record.state), event=str(to))
    if error_code is not None:
        check_error_code(error_code)
    return replace(
        record,
        state=to,
        version=record.version + 1,
        updated_at_ms=max(now_ms, record.updated_at_ms),
        error_code=error_code if error_code is not None else record.error_code,
    )
