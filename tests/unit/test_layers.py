"""The layers of docs/design.md §1, enforced over every module of ``celery_sagas/``.

Every module's imports are read with ``ast`` wherever they appear (module level, function
bodies, ``if TYPE_CHECKING:`` blocks), as absolute dotted names. Only explicit imports count:
the ``__init__`` of a parent package that Python runs first is not an import of the module.
The rules:

1. every module has a layer, from the layer table of docs/design.md §1 (read here);
2. a module imports package modules of its own layer or below, never above;
3. no import circle among the package's modules;
4. the pure layers (0 values, 1 model, 2 protocol) import only the standard library and never
   ``time``, ``random``, ``secrets``, ``logging``, ``uuid``, ``os`` or ``socket`` (no I/O, no
   clock, no randomness), except that ``_clock`` (layer 0) reads the time;
5. storage backends (everything under ``stores/``, the port too) never see records: no
   ``_records``, ``_protocol``, ``_codec`` or engine module;
6. the engine layer has no Celery and no concrete store: no celery, kombu, click, redis or
   sqlalchemy, and of ``stores/`` only the port ``stores.base``;
7. only ``_celery/``, ``cli``, ``web/``, ``contrib/`` and ``testing/driver.py`` import celery.

Each rule is a function of (module, the names it imports) returning one message per broken
import, so a failure says which import breaks which rule; the functions are also checked on
synthetic import sets, so a rule that silently stopped catching anything would fail here.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path

import pytest

import celery_sagas

ROOT = Path(celery_sagas.__file__).resolve().parent
PACKAGE = "celery_sagas"


def _module_name(path: Path) -> str:
    parts = (PACKAGE, *path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


PATHS = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}
MODULES = frozenset(PATHS)

# ---------------------------------------------------------------- the layer table
#
# Read from docs/design.md §1, one row per layer: each `name` in the modules column (outside
# parentheses) is a module, ``name/`` a package and everything under it, ``stores.base`` a
# dotted module, ``__init__`` the package root (it re-exports the facade). The most specific
# pattern wins: an exact name over a package pattern, a longer package pattern over a shorter
# one (``stores.base`` is layer 1, the rest of ``stores/`` layer 3).

DESIGN = ROOT.parent / "docs" / "design.md"


def _pattern(token: str) -> str:
    """The module pattern a name in the design page's table stands for."""
    if token == "__init__":
        return PACKAGE
    if token.endswith("/"):
        return f"{PACKAGE}.{token.rstrip('/').replace('/', '.')}.*"
    return f"{PACKAGE}.{token}"


def _without_parentheses(text: str) -> str:
    while True:
        shorter = re.sub(r"\([^()]*\)", "", text)
        if shorter == text:
            return text
        text = shorter


def read_layers(page: str) -> tuple[tuple[int, str, tuple[str, ...]], ...]:
    """The layer table of a design page: (number, name, module patterns) per row."""
    section = page.split("## 1. Layers", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d+) (\w+) \| (.+?) \| .+ \|$", section, flags=re.MULTILINE)
    return tuple(
        (int(number), name,
         tuple(_pattern(t) for t in re.findall(r"`([^`]+)`", _without_parentheses(modules))))
        for number, name, modules in rows
    )


LAYERS = read_layers(DESIGN.read_text(encoding="utf-8"))
PURE_LAYERS = frozenset({0, 1, 2})
ENGINE_LAYER = 4
NEVER_IN_PURE = frozenset({"time", "random", "secrets", "logging", "uuid", "os", "socket"})
PURE_EXCEPTIONS: Mapping[str, frozenset[str]] = {"celery_sagas._clock": frozenset({"time"})}
BACKENDS = "celery_sagas.stores.*"
NEVER_IN_BACKENDS = ("celery_sagas._records", "celery_sagas._protocol.*", "celery_sagas._codec")
NEVER_IN_ENGINE_TOP = frozenset({"celery", "kombu", "click", "redis", "sqlalchemy"})
STORE_PORT = "celery_sagas.stores.base"
CELERY_ALLOWED = (
    "celery_sagas._celery.*", "celery_sagas.cli", "celery_sagas.web.*", "celery_sagas.contrib.*",
    "celery_sagas.testing.driver",
)


def _matches(name: str, pattern: str) -> bool:
    if pattern.endswith(".*"):
        package = pattern[:-2]
        return name == package or name.startswith(package + ".")
    return name == pattern


def _specificity(pattern: str) -> tuple[int, int]:
    """Exact names first, then the longest package pattern."""
    return (1, -len(pattern)) if pattern.endswith(".*") else (0, 0)


def layer_of(module: str) -> tuple[int, str] | None:
    """(layer number, layer name) of a package module, or None when the table misses it."""
    found = [(_specificity(p), number, name) for number, name, patterns in LAYERS
             for p in patterns if _matches(module, p)]
    if not found:
        return None
    _, number, name = min(found)
    return number, name


def _within(name: str, patterns: Iterable[str]) -> bool:
    return any(_matches(name, p) for p in patterns)


def _top(name: str) -> str:
    return name.split(".")[0]


def _is_stdlib(name: str) -> bool:
    return _top(name) in sys.stdlib_module_names


# ---------------------------------------------------------------- reading imports


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> list[str]:
    """The modules an ``import from`` names: ``from . import x`` is the module ``pkg.x``."""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        base = package[: len(package) - (node.level - 1)]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    found = [f"{source}.{alias.name}" for alias in node.names if f"{source}.{alias.name}" in MODULES]
    return found if found and node.module is None else [source, *found]


def imports_in(source: str, module: str, *, is_package: bool = False) -> frozenset[str]:
    """Every module ``source`` (the text of ``module``) imports, anywhere in it."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.update(_absolute(module, is_package, node))
    return frozenset(names)


@cache
def imports_of(module: str) -> frozenset[str]:
    """Every module a package module imports, as absolute dotted names."""
    path = PATHS[module]
    return imports_in(path.read_text(encoding="utf-8"), module, is_package=path.name == "__init__.py")


def package_imports(module: str) -> frozenset[str]:
    """The package modules ``module`` imports (itself excluded)."""
    return frozenset(n for n in imports_of(module) if _top(n) == PACKAGE and n != module)


# ---------------------------------------------------------------- the rules


def _describe(module: str) -> str:
    layer = layer_of(module)
    return f"{module} (layer {layer[0]} {layer[1]})" if layer else f"{module} (no layer)"


def layer_violations(module: str, imports: Iterable[str]) -> list[str]:
    """Rule 2: imports of package modules above the module's own layer (or of no module)."""
    own = layer_of(module)
    bad = []
    for name in sorted(set(imports)):
        if _top(name) != PACKAGE or name == module:
            continue
        if name not in MODULES:
            bad.append(f"{_describe(module)} imports {name}, which is no module of the package")
            continue
        theirs = layer_of(name)
        if own is not None and theirs is not None and theirs[0] > own[0]:
            bad.append(f"{_describe(module)} imports {_describe(name)}: a layer above its own")
    return bad


def pure_violations(module: str, imports: Iterable[str]) -> list[str]:
    """Rule 4: a pure-layer module imports something outside the standard library, or I/O,
    clock or randomness."""
    layer = layer_of(module)
    if layer is None or layer[0] not in PURE_LAYERS:
        return []
    allowed = PURE_EXCEPTIONS.get(module, frozenset())
    bad = []
    for name in sorted(set(imports)):
        if _top(name) == PACKAGE:
            continue  # rule 2 keeps them at their layer or below
        if not _is_stdlib(name):
            bad.append(f"{_describe(module)} imports {name}: the pure layers use the standard "
                       "library only")
        elif _top(name) in NEVER_IN_PURE and _top(name) not in allowed:
            bad.append(f"{_describe(module)} imports {name}: the pure layers do no I/O and read no "
                       "clock or randomness")
    return bad


def backend_violations(module: str, imports: Iterable[str]) -> list[str]:
    """Rule 5: a module of ``stores/`` (the port included) imports records, the protocol, the
    codec or the engine."""
    if not _matches(module, BACKENDS):
        return []
    bad = []
    for name in sorted(set(imports)):
        if _top(name) != PACKAGE:
            continue
        layer = layer_of(name)
        if _within(name, NEVER_IN_BACKENDS) or (layer is not None and layer[0] >= ENGINE_LAYER):
            bad.append(f"{module} (a storage backend) imports {_describe(name)}: backends move "
                       "envelopes and never see records")
    return bad


def engine_violations(module: str, imports: Iterable[str]) -> list[str]:
    """Rule 6: an engine module imports Celery, a store driver or a concrete store."""
    layer = layer_of(module)
    if layer is None or layer[0] != ENGINE_LAYER:
        return []
    bad = []
    for name in sorted(set(imports)):
        if _top(name) in NEVER_IN_ENGINE_TOP:
            bad.append(f"{_describe(module)} imports {name}: the engine has no Celery and no "
                       "store driver")
        elif _matches(name, BACKENDS) and name != STORE_PORT:
            bad.append(f"{_describe(module)} imports {name}: the engine knows stores only "
                       f"through the port {STORE_PORT}")
    return bad


def celery_violations(module: str, imports: Iterable[str]) -> list[str]:
    """Rule 7: celery imported outside _celery/, cli, web/, contrib/ and testing/driver.py."""
    if _within(module, CELERY_ALLOWED):
        return []
    return [f"{_describe(module)} imports {name}: only _celery/, cli, web/, contrib/ and "
            "testing/driver.py import celery"
            for name in sorted(set(imports)) if _top(name) == "celery"]


RULES = (layer_violations, pure_violations, backend_violations, engine_violations, celery_violations)


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Rule 3: every import circle of ``graph`` (module -> modules it imports), as the modules
    of each strongly connected component with more than one member (or a self-import), each
    sorted, in sorted order (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for node in sorted(graph):
            if node not in index:
                visit(node)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found)


def cycle_path(graph: Mapping[str, Iterable[str]], component: list[str]) -> list[str]:
    """One circle through the first module of ``component``, as a path that ends where it
    starts (so a failure shows the imports that close it)."""
    members = set(component)
    start = component[0]
    path = [start]
    seen = {start}
    node = start
    while True:
        targets = sorted(t for t in graph.get(node, ()) if t in members)
        if start in targets and (len(path) > 1 or targets == [start]):
            return [*path, start]
        following = next((t for t in targets if t not in seen), None)
        if following is None:  # every target visited: close the circle at the first one seen
            back = next(t for t in targets if t in seen)
            return [*path[path.index(back):], back]
        path.append(following)
        seen.add(following)
        node = following


def package_graph() -> dict[str, frozenset[str]]:
    """module -> the package modules it imports."""
    return {module: package_imports(module) & MODULES for module in sorted(MODULES)}


# ---------------------------------------------------------------- the table and the parser


def test_every_module_of_the_package_has_a_layer() -> None:
    missing = sorted(m for m in MODULES if layer_of(m) is None)
    assert not missing, f"add these modules to the layer table of docs/design.md §1: {missing}"


def test_the_layers_are_those_of_the_design_page() -> None:
    # then: a few modules per layer, spelled out here as docs/design.md §1 spells them
    expected = {
        "celery_sagas.errors": 0, "celery_sagas._values": 0, "celery_sagas._clock": 0,
        "celery_sagas._records": 1, "celery_sagas.stores.base": 1,
        "celery_sagas._protocol.moves": 2, "celery_sagas._protocol.effects": 2,
        "celery_sagas._codec": 3, "celery_sagas.stores.memory": 3,
        "celery_sagas.stores.redis.store": 3, "celery_sagas.stores.sql.store": 3,
        "celery_sagas._engine": 4, "celery_sagas._repository": 4, "celery_sagas._sweep": 4,
        "celery_sagas._approvals.ledger": 4, "celery_sagas._metrics": 4,
        "celery_sagas._retention": 4,
        "celery_sagas._celery.facade": 5, "celery_sagas._celery.wiring": 5, "celery_sagas": 5,
        "celery_sagas.cli": 6, "celery_sagas.testing.driver": 6,
    }
    assert {m: (layer_of(m) or (None,))[0] for m in expected} == expected
    assert [number for number, _, _ in LAYERS] == list(range(7))


def test_every_name_in_the_design_pages_table_is_a_module_or_package() -> None:
    # then: a name the page lists that no module has is a typo or a module gone
    packages = {m for m in MODULES if PATHS[m].name == "__init__.py"}
    for _, name, patterns in LAYERS:
        for pattern in patterns:
            known = pattern[:-2] in packages if pattern.endswith(".*") else pattern in MODULES
            assert known, f"docs/design.md §1 ({name}) lists {pattern}, which does not exist"


def test_the_table_reader_reads_names_patterns_and_skips_parentheses() -> None:
    # given
    page = ("## 1. Layers\n\n| layer | modules | may use |\n|---|---|---|\n"
            "| 0 values | `errors`, `_records` (the `Sagas` facade (nested)) | x |\n"
            "| 1 tools | `web/`, `stores.base`, `__init__` | y |\n\n## 2. Next\n| 9 no | `x` | z |\n")

    # then
    assert read_layers(page) == (
        (0, "values", ("celery_sagas.errors", "celery_sagas._records")),
        (1, "tools", ("celery_sagas.web.*", "celery_sagas.stores.base", "celery_sagas")),
    )


def test_the_parser_sees_imports_that_are_there() -> None:
    assert "celery_sagas._records" in imports_of("celery_sagas._protocol.moves")
    assert "celery_sagas._protocol.codes" in imports_of("celery_sagas._protocol.moves")
    assert "celery" in {_top(n) for n in imports_of("celery_sagas._celery.facade")}
    assert "celery_sagas.stores.base" in imports_of("celery_sagas._engine")
    # a TYPE_CHECKING import of the driver
    assert "celery_sagas._celery.facade" in imports_of("celery_sagas.testing.driver")


def test_the_parser_reads_imports_anywhere_and_resolves_relative_ones() -> None:
    # given
    source = (
        "from typing import TYPE_CHECKING\n"
        "from . import _values as values\n"
        "from ._protocol import codes\n"
        "from .errors import SagaError\n"
        "if TYPE_CHECKING:\n"
        "    from ._engine import Engine\n"
        "def late():\n"
        "    import time\n"
        "    from .stores.redis import RedisStore\n"
    )

    # when
    found = imports_in(source, "celery_sagas._codec")
    in_a_package = imports_in("from . import moves\nfrom .. import _records\n",
                              "celery_sagas._protocol", is_package=True)

    # then
    assert found == {
        "typing", "celery_sagas._values", "celery_sagas._protocol", "celery_sagas._protocol.codes",
        "celery_sagas.errors", "celery_sagas._engine", "time", "celery_sagas.stores.redis",
    }
    assert in_a_package == {"celery_sagas._protocol.moves", "celery_sagas._records"}


# ---------------------------------------------------------------- the rules catch offenders


def test_the_layer_rule_catches_an_import_from_above() -> None:
    # when
    found = layer_violations("celery_sagas._protocol.moves",
                             {"celery_sagas._records", "celery_sagas._engine", "celery_sagas._gone"})

    # then
    assert found == [
        "celery_sagas._protocol.moves (layer 2 protocol) imports celery_sagas._engine "
        "(layer 4 engine): a layer above its own",
        "celery_sagas._protocol.moves (layer 2 protocol) imports celery_sagas._gone, which is no "
        "module of the package",
    ]
    assert layer_violations("celery_sagas._engine", {"celery_sagas._protocol.moves"}) == []
    assert layer_violations("celery_sagas._celery.facade", {"celery_sagas._engine"}) == []
    assert layer_violations("celery_sagas._engine", {"celery_sagas._celery.facade"})
    assert layer_violations("celery_sagas.stores.base", {"celery_sagas._codec"})


def test_the_pure_rule_catches_io_clocks_randomness_and_third_parties() -> None:
    for banned in sorted(NEVER_IN_PURE):
        [message] = pure_violations("celery_sagas._protocol.decide", {banned, "dataclasses"})
        assert banned in message and "no I/O" in message
    assert pure_violations("celery_sagas._records", {"os.path"})
    assert pure_violations("celery_sagas._values", {"redis"})
    assert pure_violations("celery_sagas.stores.base", {"sqlalchemy.orm"})
    # _clock, and only _clock, reads the time
    assert pure_violations("celery_sagas._clock", {"time"}) == []
    assert pure_violations("celery_sagas._clock", {"uuid"})
    assert pure_violations("celery_sagas.errors", {"time"})
    # other layers are not pure
    assert pure_violations("celery_sagas._engine", {"logging", "uuid"}) == []


def test_the_backend_rule_catches_a_store_that_sees_records() -> None:
    for name in ("celery_sagas._records", "celery_sagas._protocol.moves", "celery_sagas._codec",
                 "celery_sagas._engine", "celery_sagas._celery.facade"):
        [message] = backend_violations("celery_sagas.stores.redis.store", {name, "redis"})
        assert name in message and "never see records" in message
    assert backend_violations("celery_sagas.stores.memory",
                              {"celery_sagas.stores.base", "celery_sagas.errors"}) == []
    assert backend_violations("celery_sagas.stores.base", {"celery_sagas._records"})
    assert backend_violations("celery_sagas._codec", {"celery_sagas._records"}) == []


def test_the_engine_rule_catches_celery_drivers_and_concrete_stores() -> None:
    found = engine_violations("celery_sagas._sweep", {
        "celery", "kombu.exceptions", "redis", "sqlalchemy", "celery_sagas.stores",
        "celery_sagas.stores.memory", "celery_sagas.stores.base", "celery_sagas._records",
    })
    assert len(found) == 6
    assert all(m.startswith("celery_sagas._sweep (layer 4 engine) imports ") for m in found)
    assert not any("stores.base:" in m or "_records" in m for m in found)
    assert engine_violations("celery_sagas._celery.wiring", {"celery_sagas.stores"}) == []


def test_the_celery_rule_catches_celery_outside_the_integration() -> None:
    [message] = celery_violations("celery_sagas._engine", {"celery.result", "logging"})
    assert "celery.result" in message and "only _celery/" in message
    assert celery_violations("celery_sagas.testing.clock", {"celery"})
    for allowed in ("celery_sagas._celery.tasks", "celery_sagas.cli", "celery_sagas.web.app",
                    "celery_sagas.contrib.django", "celery_sagas.testing.driver"):
        assert celery_violations(allowed, {"celery"}) == []


def test_the_cycle_rule_finds_every_circle_and_shows_its_path() -> None:
    # given
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}, "f": {"a"},
             "g": {"h"}, "h": {"g"}}

    # when
    found = cycles(graph)

    # then
    assert found == [["a", "b", "c"], ["e"], ["g", "h"]]
    assert cycle_path(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]
    assert cycle_path(graph, ["e"]) == ["e", "e"]
    assert cycles({"a": {"b"}, "b": set()}) == []


# ---------------------------------------------------------------- the package keeps them


def _check(rule: object, module: str) -> None:
    assert callable(rule)
    broken = rule(module, imports_of(module))
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_module_imports_only_its_own_layer_and_below(module: str) -> None:
    _check(layer_violations, module)


@pytest.mark.parametrize("module", sorted(m for m in MODULES if (layer_of(m) or (9,))[0] in PURE_LAYERS))
def test_the_pure_layers_use_the_standard_library_without_io_clock_or_randomness(module: str) -> None:
    _check(pure_violations, module)


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _matches(m, BACKENDS)))
def test_storage_backends_never_see_records(module: str) -> None:
    _check(backend_violations, module)


@pytest.mark.parametrize("module", sorted(m for m in MODULES if (layer_of(m) or (9,))[0] == ENGINE_LAYER))
def test_the_engine_has_no_celery_and_no_concrete_store(module: str) -> None:
    _check(engine_violations, module)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_only_the_integration_and_the_tools_import_celery(module: str) -> None:
    _check(celery_violations, module)


def test_there_is_no_import_circle_among_the_package_modules() -> None:
    graph = package_graph()
    found = [" -> ".join(cycle_path(graph, component)) for component in cycles(graph)]
    assert not found, "import circles:\n" + "\n".join(found)
