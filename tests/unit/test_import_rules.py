"""DESIGN §4 import rules, checked by parsing every module of the package with ``ast``.

- the pure modules (``protocol/``, values, records, errors, approvals/tokens, stores/redis/keys,
  stores/base, stores/cursor) import only the standard library and each other, and never
  time, random, secrets, logging, uuid, os or socket;
- the engine layer never imports celery, kombu, redis, sqlalchemy, a concrete store or the
  Celery integration;
- stores never import the protocol or the engine;
- only ``integration/``, ``cli.py`` and ``testing/driver.py`` import celery.

Imports are read wherever they appear (function bodies and ``TYPE_CHECKING`` blocks too).
"""

from __future__ import annotations

import ast
import sys
from functools import cache
from pathlib import Path

import pytest

import celery_sagas

ROOT = Path(celery_sagas.__file__).resolve().parent
PACKAGE = "celery_sagas"


def _module_name(path: Path) -> str:
    parts = (PACKAGE, *path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _package_of(module: str) -> list[str]:
    path = MODULES[module]
    parts = module.split(".")
    return parts if path.name == "__init__.py" else parts[:-1]


def _absolute(module: str, node: ast.ImportFrom) -> list[str]:
    """The modules an ``import from`` names: ``from . import x`` is the module ``pkg.x``."""
    if node.level:
        package = _package_of(module)
        base = package[: len(package) - (node.level - 1)]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    found = [f"{source}.{alias.name}" for alias in node.names if f"{source}.{alias.name}" in MODULES]
    return found if found and node.module is None else [source, *found]


@cache
def imports_of(module: str) -> frozenset[str]:
    """Every module ``module`` imports, as absolute dotted names."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"), filename=str(MODULES[module]))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.update(_absolute(module, node))
    return frozenset(names)


def _top(name: str) -> str:
    return name.split(".")[0]


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


# ---------------------------------------------------------------- the layers

PURE_NAMED = (
    "celery_sagas._values",
    "celery_sagas._records",
    "celery_sagas.errors",
    "celery_sagas._approvals.tokens",
    "celery_sagas.stores.redis._keys",
    "celery_sagas.stores.base",
    "celery_sagas.stores._cursor",
)
PURE = sorted({m for m in MODULES if _within(m, ("celery_sagas._protocol",))} | set(PURE_NAMED))
NEVER_IN_PURE = frozenset({"time", "random", "secrets", "logging", "uuid", "os", "socket"})

ENGINE_REQUIRED = (
    "_engine", "_delivery", "_context", "_definitions", "_sweep", "_journal", "_leases", "_scans",
    "_events", "_dispatch", "_liveness", "_approvals.ledger",
)
ENGINE_OPTIONAL = ("_approvals.gate",)
ENGINE = [f"{PACKAGE}.{m}" for m in ENGINE_REQUIRED] + [
    f"{PACKAGE}.{m}" for m in ENGINE_OPTIONAL if f"{PACKAGE}.{m}" in MODULES
]
NEVER_IN_ENGINE_TOP = frozenset({"celery", "kombu", "redis", "sqlalchemy"})
NEVER_IN_ENGINE = (
    "celery_sagas.stores.redis",
    "celery_sagas.stores.sql",
    "celery_sagas.stores.memory",
    "celery_sagas._celery",
    "celery_sagas.cli",
)

STORES = sorted(m for m in MODULES if _within(m, ("celery_sagas.stores",)))
NEVER_IN_STORES = tuple(
    f"{PACKAGE}.{m}" for m in ("_protocol", "_engine", "_delivery", "_context", "_definitions", "_sweep")
)

CELERY_ALLOWED = ("celery_sagas._celery", "celery_sagas.cli", "celery_sagas.testing.driver")


def test_every_named_module_exists() -> None:
    missing = [m for m in (*PURE_NAMED, *ENGINE) if m not in MODULES]
    assert not missing
    assert any(_within(m, ("celery_sagas._protocol",)) and m != "celery_sagas._protocol" for m in PURE)


def test_the_parser_sees_imports_that_are_there() -> None:
    assert "celery_sagas._records" in imports_of("celery_sagas._protocol.moves")
    assert "celery_sagas._protocol.codes" in imports_of("celery_sagas._protocol.moves")
    assert "celery" in {_top(n) for n in imports_of("celery_sagas._celery.facade")}
    assert "celery_sagas.stores.base" in imports_of("celery_sagas._engine")


def pure_violations(module: str) -> list[str]:
    """Imports that break the pure-module rule."""
    bad = []
    for name in sorted(imports_of(module)):
        if _top(name) == PACKAGE:
            if name not in PURE and name != "celery_sagas._protocol":
                bad.append(name)
        elif _top(name) not in sys.stdlib_module_names or _top(name) in NEVER_IN_PURE:
            bad.append(name)
    return bad


def engine_violations(module: str) -> list[str]:
    """Imports that break the engine-layer rule (the package root pulls in the integration)."""
    names = imports_of(module)
    return sorted(
        n for n in names if _top(n) in NEVER_IN_ENGINE_TOP or _within(n, NEVER_IN_ENGINE) or n == PACKAGE
    )


def store_violations(module: str) -> list[str]:
    """Imports that break the stores rule."""
    return sorted(n for n in imports_of(module) if _within(n, NEVER_IN_STORES))


def celery_violations(module: str) -> list[str]:
    """Celery imports outside the integration, the CLI and the test driver."""
    if _within(module, CELERY_ALLOWED):
        return []
    return sorted(n for n in imports_of(module) if _top(n) == "celery")


def test_the_rules_catch_known_offenders() -> None:
    assert "secrets" in pure_violations("celery_sagas._journal")
    assert "logging" in pure_violations("celery_sagas._engine")
    assert "celery" in engine_violations("celery_sagas._celery.facade")
    assert "celery_sagas._protocol.decide" in store_violations("celery_sagas._engine")
    assert celery_violations("celery_sagas._celery.facade") == []


@pytest.mark.parametrize("module", PURE)
def test_pure_modules_import_only_the_standard_library_and_each_other(module: str) -> None:
    assert not pure_violations(module), f"{module} imports {pure_violations(module)}"


@pytest.mark.parametrize("module", ENGINE)
def test_the_engine_layer_imports_no_celery_driver_or_concrete_store(module: str) -> None:
    assert not engine_violations(module), f"{module} imports {engine_violations(module)}"


@pytest.mark.parametrize("module", STORES)
def test_stores_never_import_the_protocol_or_the_engine(module: str) -> None:
    assert not store_violations(module), f"{module} imports {store_violations(module)}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_only_the_integration_and_the_cli_import_celery(module: str) -> None:
    assert not celery_violations(module), f"{module} imports {celery_violations(module)}"
