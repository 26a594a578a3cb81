"""docs/errors.md documents every error class, every error code the library writes, every
finding kind, every limit and every CLI exit code: a user who meets one finds what it means and
what to do, and what the page says of limits and exit codes is what the code does."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import celery_sagas.errors as errors
from celery_sagas import _values as values
from celery_sagas import cli
from celery_sagas._celery.settings import SETTING_DOCS
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


def section(title: str) -> str:
    """The text of one ``## title`` section of docs/errors.md."""
    return DOC.read_text().split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def limit_rows() -> dict[str, str]:
    """Setting name -> the default the Limits table gives it."""
    return dict(re.findall(r"^\| [^|]+ \| `sagas_(\w+)` \(([^)]+)\) \|", section("Limits"),
                           flags=re.MULTILINE))


LIMIT_SETTINGS = sorted(name for name in SETTING_DOCS
                        if name.endswith("_limit") and name != "default_time_limit")


def test_every_limit_setting_is_in_the_limits_table_with_the_code_s_default() -> None:
    # default_time_limit is a step's duration, not a bound on what a saga holds
    assert sorted(limit_rows()) == LIMIT_SETTINGS
    for name, default in limit_rows().items():
        assert int(default) == SETTING_DOCS[name][0], name


def test_the_limits_without_a_setting_are_the_code_s() -> None:
    text = section("Limits")
    assert values.MAX_WAIT_SECONDS == 366 * 86_400 and "366 days" in text
    assert f"{values._MAX_DEPTH} levels" in text
    assert f"`{values.ERROR_CODE_RULE}`" in text
    assert f"1 to {values.MAX_REASON} printable" in text
    assert values.saga_id.max_len == values.step_name.max_len == 128 and "1 to 128" in text


def exit_rows() -> dict[int, str]:
    """Exit code -> its row's text in the CLI exit codes table."""
    return {int(code): text for code, text in
            re.findall(r"^\| (\d+) \| (.+) \|$", section("CLI exit codes"), flags=re.MULTILINE)}


def test_every_exit_code_of_the_cli_has_a_row() -> None:
    assert sorted(exit_rows()) == sorted(v for k, v in vars(cli).items() if k.startswith("EXIT_"))


def _documented_exits() -> list[tuple[str, int]]:
    """(error class, exit code) for each error the page says the CLI exits with: named in a
    row of the exit code table, or "the CLI exits N" in the error's own row."""
    pairs = [(name, code) for code, text in exit_rows().items()
             for name in re.findall(r"`(\w+)`", text) if name in errors.__all__]
    pairs += [(name, int(code)) for name, code in re.findall(
        r"^\| `(\w+)` \|.*[Tt]he CLI exits (\d)", DOC.read_text(), flags=re.MULTILINE)]
    return sorted(set(pairs))


def test_the_page_gives_the_exit_code_of_each_error_the_cli_translates() -> None:
    named = {name for name, _ in _documented_exits()}
    assert named >= {"SagaNotFound", "SagaValidationError", "PayloadTooLarge",
                     "SagaConfigurationError", "StoreError", "SagaResolutionError",
                     "SagaAlreadyFinal", "SignalLimitExceeded", "UndecryptableRecord"}


@pytest.mark.parametrize(("name", "code"), _documented_exits())
def test_an_error_exits_with_the_code_the_page_gives_it(name: str, code: int) -> None:
    error_class = getattr(errors, name)
    assert cli.exit_code(error_class.__new__(error_class)) == code
