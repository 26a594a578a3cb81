"""A faster ``dataclasses.replace`` for the frozen, slotted records of the hot path.

``dataclasses.replace`` reads every field with ``getattr`` and runs the frozen ``__init__``,
which sets each field through ``object.__setattr__``: about 6.6 µs for a ``SagaRecord``, and a
step's path copies records about 20 times (docs/performance.md, "Where the time goes"). A
record here is a plain value: frozen, slotted, every field set by ``__init__`` and no
``__post_init__``, so a copy need not run ``__init__`` again. For such a class ``replace``
builds, once, a function that creates the instance and fills its slots directly; any other
dataclass goes to ``dataclasses.replace``. Field names are checked as Python checks keyword
arguments (an unknown one raises ``TypeError``); mypy checks them as for
``dataclasses.replace``, which it sees in place of this function.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from types import MemberDescriptorType
from typing import TYPE_CHECKING, Any

__all__ = ["replace"]

_MISSING: Any = object()
_COPIERS: dict[type, Callable[..., Any]] = {}


def _copier(cls: type) -> Callable[..., Any]:
    """The function that copies an instance of ``cls`` with changed fields."""
    fields = dataclasses.fields(cls)
    names = [f.name for f in fields]
    plain = (not hasattr(cls, "__post_init__") and all(f.init for f in fields)
             and len(fields) == len(getattr(cls, "__dataclass_fields__", ()))  # no InitVar
             and all(isinstance(getattr(cls, n, None), MemberDescriptorType) for n in names))
    if not plain:
        return dataclasses.replace
    scope: dict[str, Any] = {"_new": object.__new__, "_cls": cls, "_MISSING": _MISSING}
    scope.update({f"_set_{name}": getattr(cls, name).__set__ for name in names})
    lines = [f"def replace(obj, /, *, {', '.join(f'{n}=_MISSING' for n in names)}):",
             "    new = _new(_cls)"]
    lines += [f"    _set_{n}(new, obj.{n} if {n} is _MISSING else {n})" for n in names]
    lines.append("    return new")
    exec("\n".join(lines), scope)  # generated from the class's own field names
    copy: Callable[..., Any] = scope["replace"]
    return copy


def _replace(obj: Any, /, **changes: Any) -> Any:
    """``obj`` with ``changes``, as ``dataclasses.replace`` makes it."""
    copy = _COPIERS.get(type(obj))
    if copy is None:
        copy = _COPIERS[type(obj)] = _copier(type(obj))
    return copy(obj, **changes)


if TYPE_CHECKING:
    from dataclasses import replace as replace
else:
    replace = _replace
