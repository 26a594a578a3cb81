"""The documentation is tested: README.md and docs/*.md.

Convention: every fenced ```python block must compile; a block whose first line is
``# doctest: run`` is also executed. The runnable blocks of one page run in order in one
namespace, so a page can build an example over several blocks. Every ``celery … sagas …`` or
``celery-sagas …`` line in a ```bash block must parse with the real CLI, the configuration
reference must cover every ``sagas_*`` setting with its real default, and the guarantees page
must explain every error code the library writes.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import click
import pytest
from celery import current_app

from celery_sagas._celery.settings import SETTING_DOCS
from celery_sagas._protocol import codes
from celery_sagas.cli import main

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
RUN_MARKER = "# doctest: run"
FENCE = re.compile(r"^([ \t]*)```(\w*)[^\n]*\n(.*?)^[ \t]*```", re.S | re.M)
QUICK_START = [
    "python3 -m venv .venv && .venv/bin/pip install -q -e . && .venv/bin/python -m examples.shop.demo",
    "python3 -m venv .venv && .venv/bin/pip install -q -e '.[test,redis,postgres,mysql,web,metrics]'"
    " && .venv/bin/python -m pytest",
]
REQUIRED_PAGES = {"index", "quickstart", "concepts", "guarantees", "configuration", "operations",
                  "stores", "approvals", "parallel"}


def blocks(page: Path, language: str) -> list[str]:
    """The bodies of the fenced blocks of ``language`` in ``page``."""
    return [_dedent(body, indent) for indent, lang, body in FENCE.findall(page.read_text())
            if lang == language]


def _dedent(body: str, indent: str) -> str:
    """A fenced block inside a list item is indented with its fence; take that indent off."""
    return "".join(line[len(indent):] if line.startswith(indent) else line
                   for line in body.splitlines(keepends=True))


def runnable(page: Path) -> list[str]:
    """The python blocks of ``page`` marked to run."""
    return [b for b in blocks(page, "python") if b.startswith(RUN_MARKER + "\n")]


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def cli_lines(page: Path) -> list[str]:
    """Shell lines of ``page`` that call the sagas CLI (continuations joined)."""
    found = []
    for body in blocks(page, "bash"):
        for line in body.replace("\\\n", " ").splitlines():
            line = line.split("  #", 1)[0].strip()
            if re.search(r"\bcelery(-sagas)?\b.*", line) and (" sagas " in f"{line} " or
                                                               line.startswith("celery-sagas")
                                                               or " celery-sagas " in line):
                found.append(line)
    return found


def cli_args(line: str) -> list[str]:
    """The arguments after `celery -A proj sagas` or `celery-sagas [--app X]`."""
    words = shlex.split(line)
    while "=" in words[0]:  # leading VAR=value assignments
        words.pop(0)
    if words[0] == "celery-sagas":
        words = words[1:]
        while words[0] in ("-A", "--app"):
            words = words[2:]
        return words
    assert words[0] == "celery", line
    return words[words.index("sagas") + 1:]


# ------------------------------------------------------------ code blocks


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_python_block_compiles(page: Path) -> None:
    # then
    for index, body in enumerate(blocks(page, "python")):
        compile(body, f"{page_id(page)}[python block {index}]", "exec")


@pytest.mark.parametrize("page", [p for p in PAGES if runnable(p)], ids=page_id)
def test_runnable_blocks_run(page: Path) -> None:
    # given
    namespace: dict[str, Any] = {"__name__": f"docs_{page.stem}"}
    previous = current_app._get_current_object()

    # when / then: any failed assert inside a block fails the test
    try:
        for index, body in enumerate(runnable(page)):
            exec(compile(body, f"{page_id(page)}[run block {index}]", "exec"), namespace)
    finally:
        previous.set_current()


@pytest.mark.parametrize("page", [*PAGES, *sorted(ROOT.glob("examples/**/*.py"))],
                         ids=page_id)
def test_the_docs_and_examples_import_only_the_public_surface(page: Path) -> None:
    # internal modules (named _x) may change in any release: nothing a user copies names one
    internal = re.findall(r"(?:from|import)\s+(celery_sagas(?:\.\w+)*\._\w+)", page.read_text())
    assert internal == [], f"{page_id(page)} imports internal modules"


def test_the_key_pages_have_runnable_examples() -> None:
    # then
    for name in ("quickstart", "concepts", "guarantees", "configuration", "stores"):
        assert runnable(DOCS / f"{name}.md"), name


# ------------------------------------------------------------ pages and links


def test_the_docs_folder_has_every_page_and_the_index_links_them() -> None:
    # given
    index = (DOCS / "index.md").read_text()

    # then
    assert {p.stem for p in DOCS.glob("*.md")} >= REQUIRED_PAGES
    for name in REQUIRED_PAGES - {"index"}:
        assert f"({name}.md)" in index, name


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_relative_links_point_at_files_that_exist(page: Path) -> None:
    # given
    links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text())

    # then
    for link in links:
        assert (page.parent / link).exists(), f"{page_id(page)} links to missing {link}"


def test_the_quick_start_commands_are_the_readme_ones() -> None:
    # given
    readme = blocks(ROOT / "README.md", "bash")
    quickstart = blocks(DOCS / "quickstart.md", "bash")

    # then
    for command in QUICK_START:
        assert f"{command}\n" in readme
        assert f"{command}\n" in quickstart


# ------------------------------------------------------------ CLI lines


@pytest.mark.parametrize("page", [p for p in PAGES if cli_lines(p)], ids=page_id)
def test_cli_lines_in_the_docs_parse_with_the_real_cli(page: Path) -> None:
    # then
    for line in cli_lines(page):
        args = cli_args(line)
        command = main.commands.get(args[0])
        assert command is not None, f"{page_id(page)}: no command {args[0]!r} in {line!r}"
        try:
            command.make_context(args[0], args[1:])
        except click.UsageError as exc:
            raise AssertionError(f"{page_id(page)}: {line!r}: {exc}") from None


def test_the_docs_show_every_cli_command() -> None:
    # given
    text = (DOCS / "operations.md").read_text()

    # then
    for name in main.commands:
        assert f"`{name}" in text, name


# ------------------------------------------------------------ references


def test_the_configuration_reference_covers_every_setting_with_its_default() -> None:
    # given
    rows = {}
    for line in (DOCS / "configuration.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].startswith("`sagas_"):
            rows[cells[0].strip("`")] = cells[1]

    # then
    assert set(rows) == {f"sagas_{name}" for name in SETTING_DOCS}
    for name, (default, _) in SETTING_DOCS.items():
        assert rows[f"sagas_{name}"] == f"`{default!r}`", name


def test_the_guarantees_explain_every_error_code() -> None:
    # given
    text = (DOCS / "guarantees.md").read_text()
    written = [v for k, v in vars(codes).items() if k.isupper() and isinstance(v, str)]

    # then
    assert len(written) >= 17
    for code in written:
        assert f"| `{code}` |" in text, code
