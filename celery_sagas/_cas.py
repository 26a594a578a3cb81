"""The one compare-and-set loop of the package (docs/design.md §3.10).

Every record writer reads, decides and writes with a compare-and-set; a writer that lost the
race reads again and decides again. This is that loop, written once: callers give it how to
read, what to decide from what was read, and how to write it. Losing is rare (it needs a
concurrent successful writer), so the budget only bounds a pathological livelock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from .errors import SagaConcurrencyError

__all__ = ["MAX_RACES", "until_written"]

MAX_RACES = 64

R = TypeVar("R")
W = TypeVar("W")


def until_written(
    read: Callable[[], R],
    decide: Callable[[R], W],
    write: Callable[[R, W], bool],
    *,
    what: str,
    first: R | None = None,
    budget: int = MAX_RACES,
) -> tuple[R, W]:
    """Decide on what ``read`` returns (``first`` the first time, when given) and ``write`` it;
    on a lost race (``write`` returned False) read and decide again. A decision of None means
    nothing to write (``write`` is not called).

    Returns what the decision was taken on and the decision. Raises ``SagaConcurrencyError``
    once ``budget`` races were lost.
    """
    current = first if first is not None else read()
    for _ in range(budget):
        wanted = decide(current)
        if wanted is None or write(current, wanted):
            return current, wanted
        current = read()
    raise SagaConcurrencyError(f"{what} kept changing; gave up after {budget} lost races")
