"""Regression tests for defects the reliability suite found (each names its finding)."""

from __future__ import annotations

import math

import pytest
from celery import Celery

from celery_sagas import MemoryStore, Sagas
from celery_sagas.errors import SagaConfigurationError

pytestmark = pytest.mark.e2e

DURATIONS = ["sweep_interval", "stale_after", "ambiguity_grace", "default_time_limit",
             "sweep_lease", "approval_ttl"]


@pytest.mark.parametrize("name", DURATIONS)
@pytest.mark.parametrize("value", [math.inf, math.nan, 1e300, 2**63, 367 * 24 * 3600])
def test_a_duration_setting_that_is_infinite_or_absurd_is_refused_at_construction(
    name: str, value: float
) -> None:
    # Found by the settings fuzz: inf raised OverflowError; 1e300 was accepted and every
    # later sweep failed, after the saga had been stored.
    with pytest.raises(SagaConfigurationError, match=f"sagas_{name}"):
        Sagas(Celery("regression", set_as_current=False), store=MemoryStore(),
              allow_non_durable=True, **{name: value})


@pytest.mark.parametrize("name", DURATIONS)
def test_a_duration_setting_of_a_year_is_still_accepted(name: str) -> None:
    sagas = Sagas(Celery("regression", set_as_current=False), store=MemoryStore(),
                  allow_non_durable=True, **{name: 365 * 24 * 3600})
    assert sagas.settings.sweep_lease_ms > 0
