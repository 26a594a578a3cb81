"""The documentation site (mkdocs.yml): every page is in the navigation, the API reference
covers every public area, and the strict build's hook finds public names without docstrings
(``.ci/run`` runs ``mkdocs build --strict``; these checks run without MkDocs)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

import celery_sagas
from celery_sagas import Sagas

ROOT = Path(__file__).resolve().parents[2]
API_PAGES = {"api.md": "celery_sagas", "api-errors.md": "celery_sagas.errors",
             "api-stores.md": "celery_sagas.stores", "api-testing.md": "celery_sagas.testing",
             "api-web.md": "celery_sagas.web"}


def _hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("public_docstrings",
                                                  ROOT / "docs" / "hooks" / "public_docstrings.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _nav_pages(entries: Any) -> list[str]:
    if isinstance(entries, str):
        return [entries]
    if isinstance(entries, list):
        return [page for entry in entries for page in _nav_pages(entry)]
    return [page for value in entries.values() for page in _nav_pages(value)]


def test_the_navigation_lists_every_page_of_docs() -> None:
    # given
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())

    # then
    pages = [p.name for p in (ROOT / "docs").glob("*.md")]
    assert sorted(_nav_pages(config["nav"])) == sorted(pages)


@pytest.mark.parametrize(("page", "module"), API_PAGES.items())
def test_each_public_area_has_its_reference_page(page: str, module: str) -> None:
    # then
    assert f"::: {module}\n" in (ROOT / "docs" / page).read_text()


def test_the_root_page_shows_every_export_but_the_errors_module() -> None:
    # given
    text = (ROOT / "docs" / "api.md").read_text()
    listed = {line.strip()[2:] for line in text.splitlines() if line.startswith("        - ")}

    # then
    assert listed == set(celery_sagas.__all__) - {"errors"}


def test_every_public_name_has_a_docstring() -> None:
    # then
    assert _hook().missing_docstrings() == []


def test_the_hook_names_a_public_method_without_a_docstring(monkeypatch: pytest.MonkeyPatch) -> None:
    # given
    monkeypatch.setattr(Sagas.start, "__doc__", None)

    # then
    assert _hook().missing_docstrings() == ["celery_sagas.Sagas.start"]
