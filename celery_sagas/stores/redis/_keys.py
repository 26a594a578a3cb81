"""Redis key layout of the store: pure functions, standard library only (docs/design.md §4.2).

Every key the Redis store touches is named here and nowhere else (never inside Lua)::

    {<prefix>:<b>}:r:<kind>:<id>               record hash: id version state updated_at_ms body
                                                [label] [due_at_ms] [nn, n:1 .. n:<nn>]
    {<prefix>:<b>}:s:<kind>:<state>            state index: zset, score updated_at_ms, member id
    {<prefix>:<b>}:l:<kind>:<state>:<label>    label index: zset, score updated_at_ms, member id
    {<prefix>:<b>}:d:<kind>                    due index:   zset, score due_at_ms, member id
    {<prefix>:<b>}:i:<kind>                    id index:    zset, score 0, member id (by id)
    {<prefix>:<b>}:c:<kind>                    creation:    zset, score created ms, member id
    {<prefix>:<b>}:lease:<name>                lease hash: owner token expires_at_ms fence cursor

``b`` is the bucket: CRC-32 of the record id modulo the bucket count, stable across processes
and Python versions (unlike ``hash()``). Every key of a bucket carries the hash tag
``{<prefix>:<b>}``, so each script touches one Redis Cluster slot; a scan walks the buckets.
The bucket count is part of the layout: changing it for existing data hides records.

The prefix is letters, digits, ``_``, ``-``, ``.`` and ``:`` (at most 64, starting with a
letter or digit): colons are allowed for the usual ``app:sagas`` namespacing, braces and
whitespace never, since they would break the hash tag. Kinds (identifiers) and states (no
``:``) keep the parts of an index name apart; ids and labels come last and may hold anything
printable. Callers validate with ``stores.base`` first; the checks here are a last guard.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

from ...errors import SagaValidationError

__all__ = ["DEFAULT_BUCKETS", "DEFAULT_PREFIX", "MAX_BUCKETS", "KeyLayout", "bucket_of"]

DEFAULT_PREFIX = "sagas"
DEFAULT_BUCKETS = 16
MAX_BUCKETS = 1024

_PREFIX = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")
_PRINTABLE = re.compile(r"[\x21-\x7e]+")
_KIND = re.compile(r"[a-z_][a-z0-9_]{0,31}")
_STATE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def _part(value: str, field: str, pattern: re.Pattern[str] = _PRINTABLE) -> str:
    if not pattern.fullmatch(value):
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

    def tag(self, bucket: int) -> str:
        """The hash tag shared by every key of a bucket."""
        if isinstance(bucket, bool) or not isinstance(bucket, int) or not 0 <= bucket < self.buckets:
            raise SagaValidationError(f"bucket must be in 0..{self.buckets - 1}, got {bucket!r}")
        return f"{{{self.prefix}:{bucket}}}"

    def record(self, kind: str, record_id: str) -> str:
        """The hash holding one record."""
        tag = self.tag(self.bucket(record_id))
        return f"{tag}:r:{_part(kind, 'record kind', _KIND)}:{record_id}"

    def index(self, kind: str, state: str, bucket: int, label: str | None = None) -> str:
        """The sorted set indexing a bucket's records of one state (and label) by updated_at_ms."""
        base = f"{_part(kind, 'record kind', _KIND)}:{_part(state, 'record state', _STATE)}"
        if label is None:
            return f"{self.tag(bucket)}:s:{base}"
        return f"{self.tag(bucket)}:l:{base}:{_part(label, 'record label')}"

    def record_index(self, kind: str, record_id: str, state: str, label: str | None = None) -> str:
        """A state (or label) index in the record's own bucket."""
        return self.index(kind, state, self.bucket(record_id), label)

    def due(self, kind: str, bucket: int) -> str:
        """The sorted set indexing a bucket's records of one kind by due_at_ms."""
        return f"{self.tag(bucket)}:d:{_part(kind, 'record kind', _KIND)}"

    def ids(self, kind: str, bucket: int) -> str:
        """The sorted set of a bucket's record ids of one kind, all at score 0 (lexical order:
        a prefix is one ZRANGE BYLEX)."""
        return f"{self.tag(bucket)}:i:{_part(kind, 'record kind', _KIND)}"

    def created(self, kind: str, bucket: int) -> str:
        """The sorted set indexing a bucket's records of one kind by creation time (the
        updated_at_ms ``create`` stored; later writes leave it)."""
        return f"{self.tag(bucket)}:c:{_part(kind, 'record kind', _KIND)}"

    def lease(self, name: str, bucket: int) -> str:
        """The hash holding one bucket's lease ``name`` (holder, fence, cursor)."""
        if "{" in name or "}" in name:
            raise SagaValidationError(f"lease name cannot contain braces: {name[:40]!r}")
        return f"{self.tag(bucket)}:lease:{_part(name, 'lease name')}"

    def pattern(self) -> str:
        """A SCAN MATCH pattern covering every key of this prefix (tests and tooling only)."""
        escaped = re.sub(r"([\\*?\[\]])", r"\\\1", self.prefix)
        return f"{{{escaped}:[0-9]*"
