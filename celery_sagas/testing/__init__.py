"""Test helpers that ship with the package: a frozen clock, race helpers, a store suite.

``celery_sagas.testing.conformance.StoreConformance`` needs pytest, so it is imported from its
own module rather than from here.
"""

from __future__ import annotations

from .clock import FrozenClock
from .racing import ReadTogether, race

__all__ = ["FrozenClock", "ReadTogether", "race"]
