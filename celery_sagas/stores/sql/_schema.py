"""The SQL store's two tables, built for one validated table prefix (SPEC §6, DESIGN §3).

``<prefix>envelopes`` holds every record: the routing fields the store compares and indexes,
plus the opaque JSON body. ``<prefix>leases`` holds one row per lease name; the row is never
deleted, so its fencing number only grows and its cursor survives release and expiry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import BigInteger, Column, Index, MetaData, Table

from ..._values import identifier
from ._dialects import ascii_key, long_text

__all__ = [
    "KIND_LEN",
    "LEASE_NAME_LEN",
    "OWNER_LEN",
    "RECORD_ID_LEN",
    "STATE_LEN",
    "TOKEN_HASH_LEN",
    "Tables",
    "build_tables",
]

KIND_LEN = 32
RECORD_ID_LEN = 255
STATE_LEN = 64
LEASE_NAME_LEN = 128
OWNER_LEN = 255
TOKEN_HASH_LEN = 64  # hex SHA-256: the raw token is never stored

_MYSQL_OPTIONS: dict[str, Any] = {
    "mysql_engine": "InnoDB",
    "mysql_charset": "utf8mb4",
    "mysql_collate": "utf8mb4_bin",
}


@dataclass(frozen=True, slots=True)
class Tables:
    """The store's tables bound to one ``MetaData``."""

    prefix: str
    metadata: MetaData
    envelopes: Table
    leases: Table


def build_tables(prefix: str) -> Tables:
    """Build the tables for ``prefix``; a prefix that is not an identifier is refused first."""
    prefix = identifier(prefix, field="table prefix")
    metadata = MetaData()
    envelopes = Table(
        f"{prefix}envelopes",
        metadata,
        Column("kind", ascii_key(KIND_LEN), primary_key=True),
        Column("id", ascii_key(RECORD_ID_LEN), primary_key=True),
        Column("version", BigInteger, nullable=False),
        Column("state", ascii_key(STATE_LEN), nullable=False),
        Column("updated_at_ms", BigInteger, nullable=False),
        Column("body", long_text(), nullable=False),
        # scan walks (kind, state) oldest first and pages on (updated_at_ms, id)
        Index(f"ix_{prefix}envelopes_scan", "kind", "state", "updated_at_ms", "id"),
        **_MYSQL_OPTIONS,
    )
    leases = Table(
        f"{prefix}leases",
        metadata,
        Column("name", ascii_key(LEASE_NAME_LEN), primary_key=True),
        Column("owner", ascii_key(OWNER_LEN), nullable=True),
        Column("token_hash", ascii_key(TOKEN_HASH_LEN), nullable=True),
        Column("expires_at_ms", BigInteger, nullable=False),  # 0 once released
        Column("fence", BigInteger, nullable=False),
        Column("scan_cursor", long_text(), nullable=True),
        **_MYSQL_OPTIONS,
    )
    return Tables(prefix, metadata, envelopes, leases)
