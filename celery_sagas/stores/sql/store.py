"""SqlStore: the store primitives over SQLAlchemy 2 Core (docs/design.md §4.1, §4.3).

Each primitive is one statement in its own ``engine.begin()`` block, and the engines this
module creates run in autocommit, so a primitive costs one round trip: ``create`` (an
insert-if-absent), ``get``, ``compare_and_set`` and ``delete`` (a conditional UPDATE or
DELETE), ``annotate`` (one ``UPDATE ... RETURNING``), ``scan`` and ``scan_due`` (one
index-backed SELECT per page), ``count`` (one ``SELECT COUNT(*)``) and the lease updates.
The exceptions: a refused compare-and-set reads the row back (to report an already-applied
retry) and, when fenced, the lease (to raise ``FencedWriteRefused``), as a refused fenced
delete does; the first grant of a lease name inserts its row; and MySQL/MariaDB, which lack
``UPDATE ... RETURNING``, read an annotated row back in the UPDATE's transaction (and lease
rows back by their new token).

Atomicity rests on single statements: ``UPDATE ... WHERE version = :expected`` is a
compare-and-set on every supported database (the row lock makes a concurrent writer re-check
the condition), insert-if-absent never overwrites, ``annotate`` appends inside its UPDATE
(``notes = notes || '\\n' || :note``, under the same row lock), and a lease is granted by
``UPDATE ... SET fence = fence + 1 WHERE expires_at_ms <= :now``. A SQL store has one bucket.
"""

from __future__ import annotations

import hashlib
import os
import random
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    BindParameter,
    ColumnElement,
    Delete,
    Engine,
    Exists,
    Row,
    Select,
    String,
    Table,
    Text,
    and_,
    bindparam,
    case,
    create_engine,
    delete,
    exists,
    func,
    null,
    or_,
    select,
    union_all,
    update,
)
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError, SQLAlchemyError
from sqlalchemy.sql.dml import Update

from ..._frozen import replace
from ..._values import MAX_SAFE_INTEGER, identifier
from ...errors import (
    FencedWriteRefused,
    InvalidRecordError,
    SagaValidationError,
    StoreError,
    StoreUnavailable,
)
from .._cursor import decode_cursor, encode_cursor, encode_position
from .._validating import ValidatingScanStore, ValidatingStateListing
from ..base import (
    MAX_NOTES,
    Envelope,
    Fence,
    Lease,
    LeaseHolder,
    Page,
    check_envelope,
    check_scan_args,
    prefix_end,
)
from ._dialects import (
    append_line,
    check_supported,
    engine_settings,
    insert_if_absent,
    is_memory_sqlite,
    newline_count,
    prepare_engine,
    same_or_both_null,
    update_returning,
    update_returning_in_transaction,
)
from ._durability import commit_durability
from ._schema import Tables, build_tables, upgrade_envelopes

__all__ = ["SqlStore"]

DEFAULT_PREFIX = "sagas_"
_SCHEMA_ATTEMPTS = 10  # a racer may lose once per table, column and index it creates
_MAX_STATES = 64  # stored_states stops there: a kind has a handful of states


class SqlStore(ValidatingScanStore, ValidatingStateListing):
    """Records and leases in two tables of PostgreSQL, SQLite or MySQL/MariaDB (arguments are
    checked by ``ValidatingStore``, docs/design.md §4.4)."""

    buckets: int = 1

    def __init__(
        self, engine: Engine, *, table_prefix: str = DEFAULT_PREFIX, create_schema: bool = True
    ) -> None:
        self._tables: Tables = build_tables(table_prefix)
        self._statements = _Statements(self._tables)
        check_supported(engine.dialect)
        self._engine = engine
        self._owns_engine = False
        self._password = engine.url.password
        self._in_memory = is_memory_sqlite(engine.url)
        self._commits = commit_durability(engine)
        if create_schema:
            self.create_schema()

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        table_prefix: str = DEFAULT_PREFIX,
        create_schema: bool = True,
        **engine_options: Any,
    ) -> SqlStore:
        """Open a store on a SQLAlchemy URL (``sqlite:///f.db``, ``postgresql+psycopg://…``,
        ``mysql+pymysql://…``); the store owns the engine and disposes of it on ``close``."""
        identifier(table_prefix, field="table prefix")
        engine = _open_engine(url, engine_options)
        try:
            store = cls(engine, table_prefix=table_prefix, create_schema=create_schema)
        except BaseException:
            engine.dispose()
            raise
        store._owns_engine = True
        _dispose_in_forked_children(engine)
        return store

    @property
    def durable(self) -> bool:
        """Whether what the store acknowledged survives a crash: False for an in-memory SQLite,
        and once the server was found to acknowledge commits it may lose (``_durability.py``)."""
        return not self._in_memory and self._commits.durable

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine the store runs on."""
        return self._engine

    @property
    def table_prefix(self) -> str:
        """The validated prefix of both table names."""
        return self._tables.prefix

    # ------------------------------------------------------------------ schema

    def create_schema(self) -> None:
        """Create the tables and indexes if absent, and upgrade an envelopes table made by an
        earlier version (safe to race another creator or upgrader)."""
        with self._driver_errors("create schema"), self._engine.connect() as conn:
            for attempt in range(1, _SCHEMA_ATTEMPTS + 1):
                try:
                    with conn.begin():
                        self._create_missing(conn)
                    return
                except SQLAlchemyError:
                    # Another process created an object between our check and our CREATE or
                    # ALTER (CREATE ... IF NOT EXISTS races too on PostgreSQL): look again.
                    if attempt == _SCHEMA_ATTEMPTS:
                        raise
                    time.sleep(random.uniform(0.01, 0.05) * attempt)

    def drop_schema(self) -> None:
        """Drop both tables (tests and teardown)."""
        with self._driver_errors("drop schema"):
            self._tables.metadata.drop_all(self._engine, checkfirst=True)

    def drop_tables(self) -> None:
        """Same as ``drop_schema`` (the name the shared store fixtures use)."""
        self.drop_schema()

    def _create_missing(self, conn: Connection) -> None:
        self._tables.metadata.create_all(conn, checkfirst=True)
        upgrade_envelopes(conn, self._tables.envelopes)

    # ------------------------------------------------------------------ records

    def bucket_of(self, record_id: str) -> int:
        """Always 0: a SQL store keeps every record in one bucket."""
        return 0

    def _create(self, envelope: Envelope) -> bool:
        """Insert if (kind, id) is absent, one statement; False if it exists."""
        with self._driver_errors("create"):
            return insert_if_absent(self._engine, self._tables.envelopes, _row(envelope))

    def _get(self, kind: str, record_id: str) -> Envelope | None:
        """The stored envelope with its notes, or None; a corrupt row raises
        InvalidRecordError."""
        with self._driver_errors("get"), self._engine.begin() as conn:
            row = conn.execute(self._statements.get, {"p_kind": kind, "p_id": record_id}).one_or_none()
        return None if row is None else _checked(kind, row)

    def _compare_and_set(self, envelope: Envelope, expected_version: int, fence: Fence | None) -> bool:
        """Replace the record and clear its notes if its version is ``expected_version`` and its
        label is the envelope's: one conditional UPDATE (fenced: also no newer grant of
        ``fence.lease``); an already-applied retry is True."""
        params: dict[str, Any] = {
            "p_kind": envelope.kind,
            "p_id": envelope.id,
            "p_expected": expected_version,
            "p_label": envelope.label,
            "p_version": envelope.version,
            "p_state": envelope.state,
            "p_updated": envelope.updated_at_ms,
            "p_body": envelope.body,
            "p_due": envelope.due_at_ms,
        }
        statements = self._statements
        with self._driver_errors("compare_and_set"):
            if self._write(statements.cas, statements.fenced_cas, params, fence):
                return True
            return self._read(envelope.kind, envelope.id) == envelope

    def _annotate(self, kind: str, record_id: str, note: str, expected_version: int | None
                  ) -> Envelope | None:
        """Append ``note`` and bump the version (only at ``expected_version`` when given) in one
        ``UPDATE ... RETURNING`` (MySQL/MariaDB: the UPDATE and a SELECT in one transaction);
        the envelope as written, or None when the record is absent, at another version, or
        already holds ``MAX_NOTES`` notes."""
        params: dict[str, Any] = {"p_kind": kind, "p_id": record_id, "p_note": note}
        statements = self._statements
        returning, plain = statements.annotate_returning, statements.annotate
        if expected_version is not None:
            returning, plain = statements.annotate_at_returning, statements.annotate_at
            params["p_expected"] = expected_version
        with self._driver_errors("annotate"):
            row = update_returning_in_transaction(self._engine, returning, plain, statements.get, params)
        return None if row is None else _checked(kind, row)

    def _delete(self, kind: str, record_id: str, expected_version: int, fence: Fence | None) -> bool:
        """Remove the record if its version matches: one conditional DELETE (fenced: also no
        newer grant of ``fence.lease``)."""
        params: dict[str, Any] = {"p_kind": kind, "p_id": record_id, "p_expected": expected_version}
        statements = self._statements
        with self._driver_errors("delete"):
            return self._write(statements.delete, statements.fenced_delete, params, fence)

    def _delete_many(self, items: Sequence[tuple[str, str, int]], fence: Fence | None) -> list[bool]:
        """``delete`` for each (kind, id, expected version), in one transaction: one commit for
        the batch (the retention pass deletes a page at a time, docs/design.md §7)."""
        checked = [{"p_kind": kind, "p_id": record_id, "p_expected": expected_version}
                   for kind, record_id, expected_version in items]
        stmt = self._statements.delete
        if fence is not None:
            stmt = self._statements.fenced_delete
            for params in checked:
                params.update(p_lease=fence.lease, p_fence=fence.number)
        with self._driver_errors("delete"):
            with self._engine.begin() as conn:
                done = [conn.execute(stmt, params).rowcount == 1 for params in checked]
            if not all(done):
                self._refuse_fenced(fence)
        return done

    def _read(self, kind: str, record_id: str) -> Envelope | None:
        """The stored envelope, unvalidated (it is only compared)."""
        with self._engine.begin() as conn:
            row = conn.execute(self._statements.get, {"p_kind": kind, "p_id": record_id}).one_or_none()
        return None if row is None else _envelope(kind, row)

    def _write(self, plain: Update | Delete, fenced: Update | Delete, params: dict[str, Any],
               fence: Fence | None) -> bool:
        """One conditional write (``fenced`` when a fence is given): True when it changed the
        row; when not, raises ``FencedWriteRefused`` if a newer grant of the fence's lease
        refused it."""
        stmt = plain
        if fence is not None:
            stmt = fenced
            params.update(p_lease=fence.lease, p_fence=fence.number)
        with self._engine.begin() as conn:
            if conn.execute(stmt, params).rowcount == 1:
                return True
        self._refuse_fenced(fence)
        return False

    def _refuse_fenced(self, fence: Fence | None) -> None:
        """After a refused fenced write: raise if the lease has a grant newer than the fence."""
        if fence is None:
            return
        with self._engine.begin() as conn:
            newest = conn.execute(self._statements.lease_fence, {"p_lease": fence.lease}).scalar()
        if newest is not None and newest > fence.number:
            raise FencedWriteRefused(lease=fence.lease, fence=fence.number)

    # ------------------------------------------------------------------ scans

    def _scan(self, kind: str, wanted: list[str], label: str | None, updated_before_ms: int | None,
              bucket: int | None, cursor: str | None, limit: int) -> Page:
        """One index-backed query: up to ``limit`` records of ``kind`` in ``states`` (walked in
        the order given, oldest first) and ``label``, keyset-paged from the opaque ``cursor``."""
        start, at = _resume(cursor, wanted)
        stmt = self._scan_statement(kind, wanted[start:], label, at, updated_before_ms, limit + 1)
        return self._page("scan", kind, stmt, limit, lambda following: encode_cursor(
            wanted, following.state, (following.updated_at_ms, following.id), 0))

    def _scan_due(self, kind: str, due_before_ms: int, bucket: int | None, cursor: str | None,
                  limit: int) -> Page:
        """One query on the due index: up to ``limit`` records of ``kind`` whose ``due_at_ms``
        is before ``due_before_ms``, earliest first, keyset-paged from the opaque ``cursor``."""
        _, at = _resume(cursor, ["due"])
        table = self._tables.envelopes
        stmt = select(*_record_columns(table)).where(
            table.c.kind == kind, table.c.due_at_ms < due_before_ms
        )
        if at is not None:
            stmt = stmt.where(*_from(table.c.due_at_ms, table.c.id, at))
        stmt = stmt.order_by(table.c.due_at_ms, table.c.id).limit(limit + 1)
        return self._page("scan_due", kind, stmt, limit, lambda following: encode_cursor(
            ["due"], "due", (following.due_at_ms, following.id), 0))

    def _count(self, kind: str, wanted: list[str], label: str | None, updated_after_ms: int | None,
               updated_before_ms: int | None) -> int:
        """How many records of ``kind`` in ``states`` (and ``label``) were updated in
        [``updated_after_ms``, ``updated_before_ms``): one ``SELECT COUNT(*)`` on an index."""
        table = self._tables.envelopes
        stmt = select(func.count()).select_from(table).where(
            table.c.kind == kind, table.c.state.in_(wanted)
        )
        if label is not None:
            stmt = stmt.where(table.c.label == label)
        if updated_after_ms is not None:
            stmt = stmt.where(table.c.updated_at_ms >= updated_after_ms)
        if updated_before_ms is not None:
            stmt = stmt.where(table.c.updated_at_ms < updated_before_ms)
        with self._driver_errors("count"), self._engine.begin() as conn:
            return int(conn.execute(stmt).scalar_one())

    def _count_snapshot(self, kind: str, states: list[str], labels: list[str]
                        ) -> dict[tuple[str, str | None], int]:
        """One statement, so one snapshot: ``COUNT(*)`` per (state, label) of ``kind`` on the
        (kind, label, state, ...) index, totalled here (``CountSnapshot``)."""
        table = self._tables.envelopes
        stmt = select(table.c.state, table.c.label, func.count()).where(
            table.c.kind == kind, table.c.state.in_(states)).group_by(table.c.state, table.c.label)
        with self._driver_errors("count"), self._engine.begin() as conn:
            rows = conn.execute(stmt).all()
        found = {(state, label): 0 for state in states for label in (None, *labels)}
        for state, label, count in rows:
            found[(str(state), None)] += int(count)
            if label in labels:
                found[(str(state), str(label))] += int(count)
        return found

    def _scan_prefix(self, kind: str, prefix: str, wanted: list[str], label: str | None,
                     cursor: str | None, limit: int) -> Page:
        """One statement on the primary key (kind, id): up to ``limit`` records of ``kind`` in
        ``states`` (and ``label``) whose id is in [``prefix``, the next prefix), by id, from
        the id ``cursor`` names (``PrefixScan``)."""
        table = self._tables.envelopes
        stmt = select(*_record_columns(table)).where(
            table.c.kind == kind, table.c.id >= (cursor or prefix), table.c.id < prefix_end(prefix),
            table.c.state.in_(wanted))
        if label is not None:
            stmt = stmt.where(table.c.label == label)
        stmt = stmt.order_by(table.c.id).limit(limit + 1)
        return self._page("scan_prefix", kind, stmt, limit, lambda following: str(following.id))

    def _scan_ordered(self, kind: str, states: list[str], label: str | None, before: int | None,
                      newest_first: bool, at: tuple[int, str] | None, limit: int) -> Page:
        """One statement: per state, the next ``limit + 1`` rows of the (kind, state[, label],
        updated_at_ms, id) index in that direction (an index range, read backwards for newest
        first), merged by a UNION ALL ordered the same way (``OrderedScan``)."""
        table = self._tables.envelopes
        walk = _Walk(table, kind, label, before, newest_first, at, limit)
        stmt = walk.merged([walk.member(state, table.c.updated_at_ms) for state in states])
        return self._page("scan_ordered", kind, stmt, limit,
                          lambda row: encode_position((int(row.position), str(row.id))))

    def _scan_created(self, kind: str, states: list[str], label: str | None, before: int | None,
                      newest_first: bool, at: tuple[int, str] | None, limit: int) -> Page:
        """One statement: per state, the next ``limit + 1`` rows of the (kind, state,
        created_at_ms, id) index in that direction, and of its rows without a creation time
        (inserted before the column: taken as created at their updated_at_ms until
        ``index_ids`` fills them, a NULL seek on the same index), merged by a UNION ALL on that
        position (``OrderedScan`` with ``by="created"``)."""
        table = self._tables.envelopes
        created = table.c.created_at_ms
        walk = _Walk(table, kind, label, before, newest_first, at, limit)
        stmt = walk.merged([member for state in states for member in (
            walk.member(state, created, created.is_not(None)),
            walk.member(state, table.c.updated_at_ms, created.is_(None)))])
        return self._page("scan_ordered", kind, stmt, limit,
                          lambda row: encode_position((int(row.position), str(row.id)), "created"))

    def index_ids(self, kind: str, states: Sequence[str]) -> int:
        """Give the records of ``kind`` in ``states`` inserted before the ``created_at_ms``
        column existed their last write as creation time (an approximation: the true one was
        never stored); how many rows were filled (``IdIndexing``, ``celery sagas reindex``)."""
        wanted = check_scan_args(kind, states, 1, None)
        table = self._tables.envelopes
        stmt = update(table).where(table.c.kind == kind, table.c.state.in_(wanted),
                                   table.c.created_at_ms.is_(None)
                                   ).values(created_at_ms=table.c.updated_at_ms)
        with self._driver_errors("index_ids"), self._engine.begin() as conn:
            return int(conn.execute(stmt).rowcount)

    def _page(self, operation: str, kind: str, stmt: Select[Any], limit: int,
              cursor_of: Callable[[Row[Any]], str]) -> Page:
        """Run a page's query (``limit + 1`` rows): the first ``limit`` rows as envelopes and
        ``cursor_of`` the row after them. A row of the wrong types comes back as a placeholder
        (as on Redis); the caller reports every bad record corrupt by id, so one bad row cannot
        stall every sweep."""
        with self._driver_errors(operation), self._engine.begin() as conn:
            rows = conn.execute(stmt).all()
        items = tuple(_scanned(kind, row) for row in rows[:limit])
        return Page(items, cursor_of(rows[limit]) if len(rows) > limit else None)

    def _stored_states(self, kind: str) -> list[str]:
        """The distinct ``state`` values of the records of ``kind``: one statement, a loose
        index scan (a recursive ``MIN(state) WHERE state > previous``): one index seek per
        state found, never a scan of the records."""
        with self._driver_errors("stored_states"), self._engine.begin() as conn:
            rows = conn.execute(self._statements.stored_states, {"p_kind": kind}).all()
        return [str(state) for (state,) in rows][:_MAX_STATES]

    def _scan_statement(
        self,
        kind: str,
        states: Sequence[str],
        label: str | None,
        at: tuple[int, str] | None,
        updated_before_ms: int | None,
        fetch: int,
    ) -> Select[Any]:
        table = self._tables.envelopes
        members = []
        for state in states:
            member = select(*_record_columns(table)).where(table.c.kind == kind, table.c.state == state)
            if label is not None:
                member = member.where(table.c.label == label)
            if at is not None:
                member = member.where(*_from(table.c.updated_at_ms, table.c.id, at))
                at = None
            if updated_before_ms is not None:
                member = member.where(table.c.updated_at_ms < updated_before_ms)
            members.append(member.order_by(table.c.updated_at_ms, table.c.id).limit(fetch))
        if len(members) == 1:
            return members[0]
        walked = union_all(*(select(member.subquery()) for member in members)).subquery()
        order = case(
            *((walked.c.state == state, position) for position, state in enumerate(states)),
            else_=len(states),
        )
        return select(walked).order_by(order, walked.c.updated_at_ms, walked.c.id).limit(fetch)

    # ------------------------------------------------------------------ leases

    def _acquire_lease(self, name: str, owner: str, token: str, now_ms: int, expires: int,
                       bucket: int) -> Lease | None:
        """Grant the lease of ``bucket`` (only 0 exists) unless an unexpired one exists; the
        fence grows by one per grant.

        One conditional UPDATE; only the very first grant of a name inserts its row instead.
        """
        leases = self._tables.leases
        digest = _token_hash(token)
        grant = (
            update(leases)
            .where(leases.c.name == name, leases.c.expires_at_ms <= now_ms)
            .values(owner=owner, token_hash=digest, expires_at_ms=expires, fence=leases.c.fence + 1)
        )
        ours = and_(leases.c.name == name, leases.c.token_hash == digest)
        with self._driver_errors("acquire_lease"):
            with self._engine.begin() as conn:
                row = update_returning(conn, grant, _lease_columns(leases), ours)
            if row is not None:
                return Lease(name, owner, token, expires, row.fence, row.scan_cursor, bucket)
            first = {
                "name": name,
                "owner": owner,
                "token_hash": digest,
                "expires_at_ms": expires,
                "fence": 1,
                "scan_cursor": None,
            }
            if insert_if_absent(self._engine, leases, first):
                return Lease(name, owner, token, expires, 1, None, bucket)
        return None

    def _renew_lease(self, lease: Lease, now_ms: int, expires: int) -> Lease | None:
        """Extend an unexpired lease held with this owner and token (one UPDATE)."""
        leases = self._tables.leases
        held = self._holder(lease)
        stmt = (
            update(leases)
            .where(held, leases.c.expires_at_ms > now_ms)
            .values(expires_at_ms=expires)
        )
        with self._driver_errors("renew_lease"), self._engine.begin() as conn:
            row = update_returning(conn, stmt, _lease_columns(leases), held)
        if row is None:
            return None
        return Lease(lease.name, lease.owner, lease.token, expires, row.fence, row.scan_cursor, lease.bucket)

    def _checkpoint_lease(self, lease: Lease, cursor: str | None, now_ms: int) -> bool:
        """Save the scan cursor of an unexpired lease held with this owner and token."""
        leases = self._tables.leases
        stmt = (
            update(leases)
            .where(self._holder(lease), leases.c.expires_at_ms > now_ms)
            .values(scan_cursor=cursor)
        )
        with self._driver_errors("checkpoint_lease"), self._engine.begin() as conn:
            return conn.execute(stmt).rowcount == 1

    def _release_lease(self, lease: Lease) -> bool:
        """Free the lease if held with this owner and token; the fence and cursor stay."""
        leases = self._tables.leases
        stmt = (
            update(leases)
            .where(self._holder(lease))
            .values(owner=None, token_hash=None, expires_at_ms=0)
        )
        with self._driver_errors("release_lease"), self._engine.begin() as conn:
            return conn.execute(stmt).rowcount == 1

    def _lease_holder(self, name: str, bucket: int) -> LeaseHolder | None:
        """The holder of the lease, expired or not: one SELECT by name (``LeaseTakeover``)."""
        leases = self._tables.leases
        query = (select(leases.c.owner, leases.c.fence, leases.c.expires_at_ms)
                 .where(leases.c.name == name, leases.c.owner.is_not(None)))
        with self._driver_errors("lease_holder"), self._engine.connect() as conn:
            row = conn.execute(query).one_or_none()
        return None if row is None else LeaseHolder(row.owner, row.fence, row.expires_at_ms)

    def _take_over_lease(self, name: str, owner: str, token: str, expires: int,
                         expected_fence: int, bucket: int) -> Lease | None:
        """Grant the lease while its newest grant is ``expected_fence``: one
        ``UPDATE ... WHERE fence = :expected`` (``LeaseTakeover``)."""
        leases = self._tables.leases
        digest = _token_hash(token)
        grant = (
            update(leases)
            .where(leases.c.name == name, leases.c.fence == expected_fence)
            .values(owner=owner, token_hash=digest, expires_at_ms=expires, fence=leases.c.fence + 1)
        )
        ours = and_(leases.c.name == name, leases.c.token_hash == digest)
        with self._driver_errors("take_over_lease"), self._engine.begin() as conn:
            row = update_returning(conn, grant, _lease_columns(leases), ours)
        if row is None:
            return None
        return Lease(name, owner, token, expires, row.fence, row.scan_cursor, bucket)

    def _holder(self, lease: Lease) -> Any:
        leases = self._tables.leases
        return and_(
            leases.c.name == lease.name,
            leases.c.owner == lease.owner,
            leases.c.token_hash == _token_hash(lease.token),
        )

    # ------------------------------------------------------------------ notifications

    @property
    def settle_channel(self) -> str | None:
        """The LISTEN/NOTIFY channel of ``notify_settled`` on PostgreSQL (``<prefix>settled``);
        None on the other databases, which cannot notify."""
        return f"{self._tables.prefix}settled" if self._engine.dialect.name == "postgresql" else None

    def notify_settled(self, record_id: str) -> None:
        """NOTIFY the id on PostgreSQL (one statement); nothing elsewhere. A failure is
        ignored: a listener that misses it finds the saga settled on its next poll."""
        channel = self.settle_channel
        if channel is None:
            return
        with suppress(StoreError), self._driver_errors("notify"), self._engine.begin() as conn:
            conn.execute(select(func.pg_notify(channel, record_id)))

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Dispose of the engine if this store created it; a caller's engine is left alone."""
        if self._owns_engine:
            self._engine.dispose()

    def __repr__(self) -> str:
        url = self._engine.url.render_as_string(hide_password=True)
        return f"SqlStore({url!r}, table_prefix={self._tables.prefix!r})"

    @contextmanager
    def _driver_errors(self, operation: str) -> Iterator[None]:
        """The one place driver errors become StoreError, without parameters or passwords."""
        try:
            yield
        except SQLAlchemyError as exc:
            raise StoreError(self._describe(operation, exc)) from exc

    def _describe(self, operation: str, exc: SQLAlchemyError) -> str:
        cause: BaseException = exc.orig if isinstance(exc, DBAPIError) and exc.orig else exc
        lines = str(cause).strip().splitlines() if isinstance(exc, DBAPIError) else []
        detail = type(cause).__name__ + (f": {lines[0][:200]}" if lines else "")
        if self._password:
            detail = detail.replace(self._password, "***")
        return f"SQL store {operation} failed ({self._engine.dialect.name}): {detail}"


class _Statements:
    """The hot-path statements, built once with bound parameters.

    Building a Core statement and its cache key on every call cost more Python time than the
    database round trip on a busy worker; a prebuilt statement memoizes both.
    """

    def __init__(self, tables: Tables) -> None:
        table, leases = tables.envelopes, tables.leases
        columns = _record_columns(table)
        self.get: Select[Any] = select(*columns).where(*_by_id(table))
        self.cas = _compare_and_set(table)
        self.fenced_cas: Update = self.cas.where(~_newer_grant(leases))
        self.delete: Delete = delete(table).where(*_by_id(table), _at_version(table))
        self.fenced_delete: Delete = self.delete.where(~_newer_grant(leases))
        self.annotate = _annotate(table)
        self.annotate_at: Update = self.annotate.where(_at_version(table))
        self.annotate_returning = self.annotate.returning(*columns)
        self.annotate_at_returning = self.annotate_at.returning(*columns)
        self.lease_fence: Select[Any] = select(leases.c.fence).where(leases.c.name == bindparam("p_lease"))
        self.stored_states: Select[Any] = _stored_states(table)


@dataclass(frozen=True, slots=True)
class _Walk:
    """One page of an ordered scan: each member one state's index range by (position, id)."""

    table: Table
    kind: str
    label: str | None
    before: int | None
    newest_first: bool
    at: tuple[int, str] | None
    limit: int

    def member(self, state: str, position: Any, *only: ColumnElement[bool]) -> Select[Any]:
        """The state's next ``limit + 1`` rows by (``position``, id) from ``at`` in the walk's
        direction (of ``label``, last written before ``before``, and ``only``)."""
        c = self.table.c
        member = select(*_record_columns(self.table), position.label("position")).where(
            c.kind == self.kind, c.state == state, *only)
        if self.label is not None:
            member = member.where(c.label == self.label)
        if self.before is not None:
            member = member.where(c.updated_at_ms < self.before)
        if self.at is not None:
            bound = _until if self.newest_first else _from
            member = member.where(*bound(position, c.id, self.at))
        return member.order_by(*_order_on(position, c.id, self.newest_first)).limit(self.limit + 1)

    def merged(self, members: list[Select[Any]]) -> Select[Any]:
        """The members as one list by (position, id): a UNION ALL when more than one."""
        if len(members) == 1:
            return members[0]
        union = union_all(*(select(member.subquery()) for member in members)).subquery()
        return select(union).order_by(*_order_on(union.c.position, union.c.id,
                                                 self.newest_first)).limit(self.limit + 1)


def _by_id(table: Table) -> tuple[ColumnElement[bool], ...]:
    return table.c.kind == bindparam("p_kind"), table.c.id == bindparam("p_id")


def _at_version(table: Table) -> ColumnElement[bool]:
    return table.c.version == bindparam("p_expected")


def _compare_and_set(table: Table) -> Update:
    """Replace the record at ``p_expected`` carrying the same label, and clear its notes."""
    same_label = same_or_both_null(table.c.label, bindparam("p_label", type_=String))
    return (
        update(table)
        .where(*_by_id(table), _at_version(table), same_label)
        .values(
            version=bindparam("p_version"),
            state=bindparam("p_state"),
            updated_at_ms=bindparam("p_updated"),
            body=bindparam("p_body"),
            due_at_ms=bindparam("p_due", type_=BigInteger),
            notes=null(),
        )
    )


def _annotate(table: Table) -> Update:
    """Append ``p_note`` and bump the version; nothing else of the row changes."""
    notes = table.c.notes
    # MAX_NOTES notes are joined by MAX_NOTES - 1 newlines
    room = or_(notes.is_(None), newline_count(notes) < MAX_NOTES - 1)
    return (
        update(table)
        .where(*_by_id(table), room)
        .values(
            version=table.c.version + 1,
            notes=append_line(notes, bindparam("p_note", type_=Text)),
        )
    )


def _newer_grant(leases: Table) -> Exists:
    """A grant of lease ``p_lease`` newer than fence ``p_fence``. Leases are per (name, bucket);
    this store has only bucket 0, so a lease's row is keyed by its name alone."""
    return exists().where(leases.c.name == bindparam("p_lease"), leases.c.fence > bindparam("p_fence"))


def _record_columns(table: Table) -> tuple[Any, ...]:
    c = table.c
    return (c.id, c.version, c.state, c.updated_at_ms, c.body, c.label, c.due_at_ms, c.notes)


def _lease_columns(table: Any) -> tuple[Any, ...]:
    return (table.c.fence, table.c.scan_cursor)


def _row(envelope: Envelope) -> dict[str, Any]:
    return {
        "kind": envelope.kind,
        "id": envelope.id,
        "version": envelope.version,
        "state": envelope.state,
        "updated_at_ms": envelope.updated_at_ms,
        "body": envelope.body,
        "label": envelope.label,
        "due_at_ms": envelope.due_at_ms,
        "notes": None,
        "created_at_ms": envelope.updated_at_ms,  # the creation time scan_ordered sorts by
    }


def _envelope(kind: str, row: Row[Any]) -> Envelope:
    """An envelope from a row (its record columns first; a sort position may follow); a row
    whose columns have the wrong types is an invalid record."""
    record_id, version, state, updated_at_ms, body, label, due_at_ms, notes = tuple(row)[:8]
    if not (
        type(version) is int
        and 0 <= version <= MAX_SAFE_INTEGER  # as on Redis: a BIGINT holds up to 2**63-1
        and type(updated_at_ms) is int
        and isinstance(state, str)
        and isinstance(body, str)
        and (label is None or isinstance(label, str))
        and (due_at_ms is None or type(due_at_ms) is int)
        and (notes is None or isinstance(notes, str))
    ):
        raise InvalidRecordError(kind=kind, record_id=str(record_id))
    noted = tuple(notes.split("\n")) if notes else ()
    return Envelope(kind, record_id, version, state, updated_at_ms, body, label, due_at_ms, noted)


def _checked(kind: str, row: Row[Any]) -> Envelope:
    """The envelope of a row read by id, its routing fields validated as on write."""
    envelope = _envelope(kind, row)
    try:
        check_envelope(replace(envelope, notes=()) if envelope.notes else envelope)
    except SagaValidationError:
        raise InvalidRecordError(kind=kind, record_id=envelope.id) from None
    return envelope


def _stored_states(table: Table) -> Select[Any]:
    """The distinct states of one kind, by a loose index scan (docs/design.md §5)."""
    kind: BindParameter[str] = bindparam("p_kind")
    first = select(func.min(table.c.state).label("state")).where(table.c.kind == kind)
    found = first.cte("found_states", recursive=True)
    after = select(func.min(table.c.state)).where(
        table.c.kind == kind, table.c.state > found.c.state).scalar_subquery()
    found = found.union_all(select(after).where(found.c.state.is_not(None)))
    return select(found.c.state).where(found.c.state.is_not(None))


def _scanned(kind: str, row: Row[Any]) -> Envelope:
    """The envelope of a scanned row; a placeholder without a body (as on Redis) when a column
    has the wrong type or is out of range. It keeps a version out of range, so the caller can
    name the cause with the record."""
    try:
        return _envelope(kind, row)
    except InvalidRecordError:
        record_id, version, state, updated_at_ms, *_ = tuple(row)
        at = updated_at_ms if type(updated_at_ms) is int else 0
        return Envelope(kind, str(record_id), version if type(version) is int else 0, str(state),
                        at, "")


def _resume(cursor: str | None, states: Sequence[str]) -> tuple[int, tuple[int, str] | None]:
    """The state index and position a scan resumes at; the cursor names bucket 0, the only one."""
    start, at, (cursor_bucket,) = decode_cursor(cursor, states, extras=1)
    if cursor_bucket != 0:
        raise SagaValidationError("malformed scan cursor")
    return start, at


def _from(position: ColumnElement[int], record_id: ColumnElement[str], at: tuple[int, str]
          ) -> tuple[ColumnElement[bool], ...]:
    """Index order from ``at`` on, inclusive: a cursor names the first item of its page."""
    # ">=" is the index range; the OR only drops the ties before the cursor's id
    return position >= at[0], or_(position > at[0], record_id >= at[1])


def _until(position: ColumnElement[int], record_id: ColumnElement[str], at: tuple[int, str]
           ) -> tuple[ColumnElement[bool], ...]:
    """Index order down from ``at``, inclusive (``_from`` read backwards)."""
    return position <= at[0], or_(position < at[0], record_id <= at[1])


def _order_on(position: Any, record_id: Any, newest_first: bool) -> tuple[Any, ...]:
    """ORDER BY (position, id), descending for newest first."""
    if newest_first:
        return position.desc(), record_id.desc()
    return position, record_id


def _token_hash(lease_token: str) -> str:
    """Only the token's SHA-256 is stored, and compared in SQL: equal hashes reveal nothing
    about a guess, which keeps the comparison effectively constant-time."""
    return hashlib.sha256(lease_token.encode("ascii")).hexdigest()


def _open_engine(url: str, options: dict[str, Any]) -> Engine:
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError, TypeError):
        raise StoreUnavailable("the SQL store URL is not a valid SQLAlchemy URL") from None
    parsed, merged = engine_settings(parsed, options)
    try:
        engine = create_engine(parsed, **merged)
    except NoSuchModuleError:
        raise StoreUnavailable(
            f"SQLAlchemy has no dialect for {parsed.drivername!r}"
        ) from None
    try:
        check_supported(engine.dialect)
        prepare_engine(engine)
    except BaseException:
        engine.dispose()
        raise
    return engine


def _dispose_in_forked_children(engine: Engine) -> None:
    """A forked worker must not share pooled sockets with its parent (SQLAlchemy's advice)."""
    if not hasattr(os, "register_at_fork"):
        return
    ref = weakref.ref(engine)

    def after_fork() -> None:
        alive = ref()
        if alive is not None:
            alive.dispose(close=False)

    os.register_at_fork(after_in_child=after_fork)
