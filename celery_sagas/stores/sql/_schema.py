"""The SQL store's two tables, built for one validated table prefix (docs/design.md §4.3).

``<prefix>envelopes`` holds every record: the routing fields the store compares and indexes
(``label`` and ``due_at_ms`` included), the notes appended since the last compare-and-set
(newline-separated: a note never holds a newline), plus the opaque JSON body. Three indexes
serve the scans and counts: (kind, state, updated_at_ms, id), (kind, label, state,
updated_at_ms, id) and (kind, due_at_ms, id), and a fourth the sort by creation,
(kind, state, created_at_ms, id); every key column is ASCII, so on MySQL/MariaDB
each index stays far below InnoDB's 3072-byte key limit (the widest is 487 bytes).

``<prefix>leases`` holds one row per lease name; the row is never deleted, so its fencing
number only grows and its cursor survives release and expiry.

A table made by an earlier version lacks ``label``, ``due_at_ms``, ``notes``,
``created_at_ms`` and the newer indexes; ``upgrade_envelopes`` adds them (all nullable, so
existing rows stay valid).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import BigInteger, Column, Index, MetaData, Table, inspect
from sqlalchemy.engine import Connection
from sqlalchemy.schema import CreateColumn

from ..._values import identifier
from ._dialects import ascii_key, long_text

__all__ = [
    "KIND_LEN",
    "LABEL_LEN",
    "LEASE_NAME_LEN",
    "OWNER_LEN",
    "RECORD_ID_LEN",
    "STATE_LEN",
    "TOKEN_HASH_LEN",
    "Tables",
    "build_tables",
    "upgrade_envelopes",
]

KIND_LEN = 32
RECORD_ID_LEN = 255
STATE_LEN = 64
LABEL_LEN = 128
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
        Column("label", ascii_key(LABEL_LEN), nullable=True),
        Column("due_at_ms", BigInteger, nullable=True),
        Column("notes", long_text(), nullable=True),  # NULL or empty: no notes
        # the updated_at_ms of the envelope ``create`` inserted, never changed after; NULL on a
        # row inserted before the column existed (``index_ids`` fills it with updated_at_ms)
        Column("created_at_ms", BigInteger, nullable=True),
        # scan and count walk (kind, state[, label]) oldest first, paging on (updated_at_ms, id)
        Index(f"ix_{prefix}envelopes_scan", "kind", "state", "updated_at_ms", "id"),
        Index(f"ix_{prefix}envelopes_label", "kind", "label", "state", "updated_at_ms", "id"),
        Index(f"ix_{prefix}envelopes_due", "kind", "due_at_ms", "id"),
        # scan_ordered(by="created") walks (kind, state) by (created_at_ms, id)
        Index(f"ix_{prefix}envelopes_created", "kind", "state", "created_at_ms", "id"),
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


def upgrade_envelopes(conn: Connection, envelopes: Table) -> None:
    """Add the nullable columns and the indexes an existing envelopes table lacks."""
    present = {column["name"] for column in inspect(conn).get_columns(envelopes.name)}
    table = conn.dialect.identifier_preparer.format_table(envelopes)
    for column in envelopes.columns:
        if column.name not in present and column.nullable:
            definition = CreateColumn(column).compile(dialect=conn.dialect)
            conn.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN {definition}")
    for index in envelopes.indexes:
        index.create(conn, checkfirst=True)
