"""The Lua scripts of the Redis store: one ``.lua`` file per mutating primitive (package data).

Each script is registered once per client with redis-py's ``register_script``: calls go by
EVALSHA and reload the text on NOSCRIPT (after a restart, failover or ``SCRIPT FLUSH``).
The contract of each script (its KEYS, ARGV and replies) is the header of its file.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from redis import Redis
    from redis.commands.core import Script

__all__ = ["RECORD_SCRIPTS", "SCRIPT_NAMES", "Scripts", "script_text"]

SCRIPT_NAMES = (
    "create",
    "compare_and_set",
    "annotate",
    "delete",
    "acquire_lease",
    "renew_lease",
    "checkpoint_lease",
    "release_lease",
    "index_id",
    "take_over_lease",
)


# The scripts that begin with the checks of ``lua/_record.lua`` (fence, then record hash).
RECORD_SCRIPTS = frozenset({"compare_and_set", "delete"})


def _lua(name: str) -> str:
    return resources.files("celery_sagas.stores.redis").joinpath("lua").joinpath(f"{name}.lua") \
        .read_text("utf-8")


@cache
def script_text(name: str) -> str:
    """The Lua source of one primitive, read from the package's ``lua/`` folder: its contract
    header, then (for ``RECORD_SCRIPTS``) the shared ``_record.lua`` functions, then its body."""
    if name not in SCRIPT_NAMES:
        raise KeyError(name)
    text = _lua(name)
    if name not in RECORD_SCRIPTS:
        return text
    header, _, body = text.partition("\n\n")  # the header ends at the first blank line
    return f"{header}\n\n{_lua('_record')}\n{body}"


@dataclass(frozen=True, slots=True)
class Scripts:
    """The mutating primitives' scripts registered on one client."""

    create: Script
    compare_and_set: Script
    annotate: Script
    delete: Script
    acquire_lease: Script
    renew_lease: Script
    checkpoint_lease: Script
    release_lease: Script
    index_id: Script
    take_over_lease: Script

    @classmethod
    def register(cls, client: Redis) -> Scripts:
        """Register every script on ``client`` (no round trip: loading is lazy, by SHA)."""
        return cls(*(client.register_script(script_text(name)) for name in SCRIPT_NAMES))
