"""MkDocs hook: a public name of the API reference without a docstring fails the strict build.

The public surface (docs/design.md §1) is what ``celery_sagas/__init__.py``, ``errors``,
``stores``, ``testing`` and ``web`` export, and the public methods and properties of the classes among
them. Each missing docstring is logged as a warning, which ``mkdocs build --strict`` turns into
a failure.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from typing import Any

log = logging.getLogger("mkdocs.plugins.public_docstrings")

PUBLIC_MODULES = (
    "celery_sagas", "celery_sagas.errors", "celery_sagas.stores", "celery_sagas.testing",
    "celery_sagas.web",
)


def missing_docstrings() -> list[str]:
    """Dotted names of public objects whose docstring is missing or empty."""
    missing: list[str] = []
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        if not (module.__doc__ or "").strip():
            missing.append(module_name)
        for name in getattr(module, "__all__", ()):
            value = getattr(module, name)
            if inspect.ismodule(value):
                continue
            missing.extend(_missing_in(f"{module_name}.{name}", value))
    return sorted(set(missing))


def _missing_in(path: str, value: Any) -> list[str]:
    if not (inspect.isclass(value) or callable(value)):
        return []  # constants document themselves on the page that lists them
    found = [] if (inspect.getdoc(value) or "").strip() else [path]
    if inspect.isclass(value):
        for name, member in vars(value).items():
            if name.startswith("_") or not _documentable(member):
                continue
            if not (inspect.getdoc(member) or "").strip():
                found.append(f"{path}.{name}")
    return found


def _documentable(member: Any) -> bool:
    return (inspect.isfunction(member) or isinstance(member, (property, classmethod, staticmethod)))


def on_config(config: Any, **_: Any) -> Any:
    """Warn once per public name without a docstring."""
    for name in missing_docstrings():
        log.warning("public name without a docstring: %s", name)
    return config
