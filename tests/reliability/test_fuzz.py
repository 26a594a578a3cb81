"""Hypothesis fuzz of every public input: a documented error and nothing stored, or success."""

from __future__ import annotations

import pytest

from tests.reliability.fuzz import PROPERTIES, fuzz

pytestmark = pytest.mark.e2e

EXAMPLES = 150


@pytest.mark.parametrize(("name", "strategy", "check"), PROPERTIES, ids=[p[0] for p in PROPERTIES])
def test_public_inputs_raise_only_documented_errors_and_store_nothing(
    name: str, strategy: object, check: object,
) -> None:
    fuzz(strategy, check, EXAMPLES)  # type: ignore[arg-type]
