"""Test helpers that ship with the package: a controllable clock and the store conformance suite.

``celery_sagas.testing.conformance.StoreConformance`` needs pytest, so it is imported from its
own module rather than from here.
"""

from __future__ import annotations

from .clock import FrozenClock

__all__ = ["FrozenClock"]
