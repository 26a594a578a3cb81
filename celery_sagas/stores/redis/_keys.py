"""Redis key layout of the store: pure functions, standard library only (DESIGN §3).

Every key the Redis store touches is named here and nowhere else (never inside Lua)::

    {<prefix>:<kind>:<bucket>}:r:<id>        record hash: id, version, state, updated_at_ms, body
    {<prefix>:<kind>:<bucket>}:s:<state>     state index: sorted set, score updated_at_ms, member id
    {<prefix>:lease:<name>}:holder           lease hash: owner, token, expires_at_ms, fence
    {<prefix>:lease:<name>}:fence            fencing counter (only ever incremented)
    {<prefix>:lease:<name>}:cursor           saved scan cursor (survives release and expiry)

``bucket`` is CRC-32 of the id modulo the bucket count: stable across processes and Python
versions (unlike ``hash()``). A record and every state index of its bucket share one hash tag,
so each record primitive touches a single Redis Cluster slot; a scan walks the buckets.
The bucket count is part of the layout: changing it for existing data hides records.

The prefix is letters, digits, ``_``, ``-``, ``.`` and ``:`` (at most 64, starting with a
letter or digit): colons are allowed for the usual ``app:sagas`` namespacing, braces and
whitespace never, since they would break the hash tag. Record ids and states follow the tag,
where Redis no longer looks for one, so they may hold braces; kinds and lease names are inside
it and may not. Callers validate ids, kinds, states and lease names with ``stores.base`` first;
the checks here are a last guard against a key that could escape its hash tag.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

from ...errors import SagaValidationError

__all__ = ["DEFAULT_BUCKETS", "DEFAULT_PREFIX", "MAX_BUCKETS", "KeyLayout", "LeaseKeys", "bucket_of"]

DEFAULT_PREFIX = "sagas"
DEFAULT_BUCKETS = 16
MAX_BUCKETS = 1024

_PREFIX = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")
# Printable ASCII without space: what stores.base lets through, nothing more. Braces only
# after the hash tag (Redis takes the tag from the first "{" to the next "}").
_AFTER_TAG = re.compile(r"[\x21-\x7e]+")
_IN_TAG = re.compile(r"[\x21-\x7a\x7c\x7e]+")


def _part(value: str, field: str, *, in_tag: bool = False) -> str:
    if not (_IN_TAG if in_tag else _AFTER_TAG).fullmatch(value):
        raise SagaValidationError(f"{field} cannot be part of a Redis key: {value[:40]!r}")
    return value


def check_prefix(prefix: object) -> str:
    """Accept a key prefix such as ``sagas`` or ``shop:sagas``."""
    if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
        raise SagaValidationError(
            "redis key prefix must be 1..64 of letters, digits, '_', '-', '.', ':' "
            f"starting with a letter or digit: {str(prefix)[:40]!r}"
        )
    return prefix


def check_buckets(buckets: object) -> int:
    """Accept a bucket count in 1..MAX_BUCKETS."""
    if isinstance(buckets, bool) or not isinstance(buckets, int):
        raise SagaValidationError(f"buckets must be an int, got {type(buckets).__name__}")
    if not 1 <= buckets <= MAX_BUCKETS:
        raise SagaValidationError(f"buckets must be in 1..{MAX_BUCKETS}, got {buckets}")
    return buckets


def bucket_of(record_id: str, buckets: int) -> int:
    """The bucket of a record id: CRC-32 of its ASCII bytes modulo ``buckets``."""
    return zlib.crc32(record_id.encode("ascii")) % buckets


@dataclass(frozen=True, slots=True)
class LeaseKeys:
    """The three keys of one lease name (one hash tag)."""

    holder: str
    fence: str
    cursor: str


@dataclass(frozen=True, slots=True)
class KeyLayout:
    """Names every key of one store: a validated prefix and bucket count."""

    prefix: str = DEFAULT_PREFIX
    buckets: int = DEFAULT_BUCKETS

    def __post_init__(self) -> None:
        check_prefix(self.prefix)
        check_buckets(self.buckets)

    def bucket(self, record_id: str) -> int:
        """The bucket a record id lives in."""
        return bucket_of(_part(record_id, "record id"), self.buckets)

    def tag(self, kind: str, bucket: int) -> str:
        """The hash tag shared by a bucket's records and state indexes."""
        if not 0 <= bucket < self.buckets:
            raise SagaValidationError(f"bucket must be in 0..{self.buckets - 1}, got {bucket}")
        return f"{{{self.prefix}:{_part(kind, 'record kind', in_tag=True)}:{bucket}}}"

    def record(self, kind: str, record_id: str) -> str:
        """The hash holding one record."""
        return f"{self.tag(kind, self.bucket(record_id))}:r:{record_id}"

    def index(self, kind: str, state: str, bucket: int) -> str:
        """The sorted set indexing a bucket's records of one state by updated_at_ms."""
        return f"{self.tag(kind, bucket)}:s:{_part(state, 'record state')}"

    def record_index(self, kind: str, record_id: str, state: str) -> str:
        """The state index in the record's own bucket."""
        return self.index(kind, state, self.bucket(record_id))

    def lease(self, name: str) -> LeaseKeys:
        """The holder, fence counter and cursor keys of a lease name."""
        tag = f"{{{self.prefix}:lease:{_part(name, 'lease name', in_tag=True)}}}"
        return LeaseKeys(f"{tag}:holder", f"{tag}:fence", f"{tag}:cursor")

    def pattern(self) -> str:
        """A SCAN MATCH pattern covering every key of this prefix (tests and tooling only)."""
        escaped = re.sub(r"([\\*?\[\]])", r"\\\1", self.prefix)
        return f"{{{escaped}:*"
