"""docs/errors.md documents every error class, every error code the library writes and every
finding kind: a user who meets one finds what it means and what to do."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import celery_sagas.errors as errors
from celery_sagas._protocol import codes
from celery_sagas._protocol.findings import FindingKind

DOC = Path(__file__).resolve().parents[2] / "docs" / "errors.md"


def documented() -> set[str]:
    """Every name written as code (`name`) at the start of a table row of docs/errors.md."""
    return set(re.findall(r"^\| `([^`]+)` \|", DOC.read_text(), flags=re.MULTILINE))


def library_codes() -> list[str]:
    return sorted(v for k, v in vars(codes).items() if k.isupper() and isinstance(v, str))


@pytest.mark.parametrize("code", library_codes())
def test_every_error_code_the_library_writes_is_documented(code: str) -> None:
    assert code in documented(), f"docs/errors.md has no row for the error code {code!r}"


@pytest.mark.parametrize("name", sorted(errors.__all__))
def test_every_error_class_is_documented(name: str) -> None:
    assert name in documented(), f"docs/errors.md has no row for {name}"


@pytest.mark.parametrize("kind", [str(k) for k in FindingKind])
def test_every_finding_kind_is_documented(kind: str) -> None:
    assert kind in documented(), f"docs/errors.md has no row for the finding kind {kind!r}"


@pytest.mark.parametrize("name", ["unknown_task", "invalid_retry_policy", "invalid_result",
                                  "SagaUsageError"])
def test_codes_and_errors_added_by_the_misuse_checks_are_documented(name: str) -> None:
    assert name in documented()


def test_the_error_page_is_in_the_site_and_linked_from_readme_and_operations() -> None:
    root = DOC.parents[1]
    assert "errors.md" in (root / "mkdocs.yml").read_text()
    assert "(docs/errors.md)" in (root / "README.md").read_text()
    assert "(errors.md)" in (root / "docs" / "operations.md").read_text()
