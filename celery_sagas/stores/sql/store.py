"""SqlStore: the eight store primitives over SQLAlchemy 2 Core (SPEC §6, DESIGN §3).

Each primitive is one statement in its own ``engine.begin()`` block and the engines this
module creates run in autocommit, so a primitive costs one round trip. The exceptions:
a refused compare-and-set reads the row back (to report an already-applied retry or a fenced
refusal), the first grant of a lease name inserts its row, and dialects without
``UPDATE ... RETURNING`` (MySQL/MariaDB) read lease rows back after updating them.

Atomicity rests on single statements: ``UPDATE ... WHERE version = :expected`` is a
compare-and-set on every supported database (the row lock makes a concurrent writer re-check
the condition), insert-if-absent never overwrites, and a lease is granted by
``UPDATE ... SET fence = fence + 1 WHERE expires_at_ms <= :now``.
"""

from __future__ import annotations

import hashlib
import os
import random
import time
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import (
    Engine,
    Row,
    Select,
    and_,
    bindparam,
    case,
    create_engine,
    exists,
    or_,
    select,
    union_all,
    update,
)
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError, SQLAlchemyError
from sqlalchemy.sql.dml import Update

from ..._values import duration_ms, identifier, timestamp_ms
from ...errors import (
    FencedWriteRefused,
    InvalidRecordError,
    SagaValidationError,
    StoreError,
    StoreUnavailable,
)
from .._cursor import decode_cursor, encode_cursor
from ..base import (
    Envelope,
    Fence,
    Lease,
    Page,
    check_envelope,
    check_fence,
    check_key,
    check_lease_args,
    check_scan_args,
)
from ._dialects import (
    check_supported,
    engine_settings,
    insert_if_absent,
    is_memory_sqlite,
    prepare_engine,
    update_returning,
)
from ._schema import Tables, build_tables

__all__ = ["SqlStore"]

DEFAULT_PREFIX = "sagas_"
_SCHEMA_ATTEMPTS = 6


class SqlStore:
    """Records and leases in two tables of PostgreSQL, SQLite or MySQL/MariaDB."""

    durable: bool

    def __init__(
        self, engine: Engine, *, table_prefix: str = DEFAULT_PREFIX, create_schema: bool = True
    ) -> None:
        self._tables: Tables = build_tables(table_prefix)
        self._statements = _Statements(self._tables)
        check_supported(engine.dialect)
        self._engine = engine
        self._owns_engine = False
        self._password = engine.url.password
        self.durable = not is_memory_sqlite(engine.url)
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
    def engine(self) -> Engine:
        """The SQLAlchemy engine the store runs on."""
        return self._engine

    @property
    def table_prefix(self) -> str:
        """The validated prefix of both table names."""
        return self._tables.prefix

    # ------------------------------------------------------------------ schema

    def create_schema(self) -> None:
        """Create the tables and the scan index if absent (safe to race another creator)."""
        with self._driver_errors("create schema"), self._engine.connect() as conn:
            for attempt in range(1, _SCHEMA_ATTEMPTS + 1):
                try:
                    with conn.begin():
                        self._create_missing(conn)
                    return
                except SQLAlchemyError:
                    # Another process created an object between our check and our CREATE
                    # (CREATE ... IF NOT EXISTS races too on PostgreSQL): look again.
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
        for index in self._tables.envelopes.indexes:  # also repairs a table left without it
            index.create(conn, checkfirst=True)

    # ------------------------------------------------------------------ records

    def create(self, envelope: Envelope) -> bool:
        """Insert if (kind, id) is absent, one statement; False if it exists."""
        check_envelope(envelope)
        with self._driver_errors("create"):
            return insert_if_absent(self._engine, self._tables.envelopes, _row(envelope))

    def get(self, kind: str, record_id: str) -> Envelope | None:
        """Return the stored envelope or None; a corrupt row raises InvalidRecordError."""
        check_key(kind, record_id)
        with self._driver_errors("get"), self._engine.begin() as conn:
            row = conn.execute(self._statements.get, {"p_kind": kind, "p_id": record_id}).one_or_none()
        if row is None:
            return None
        envelope = _envelope(kind, row)
        try:
            check_envelope(envelope)
        except SagaValidationError:
            raise InvalidRecordError(kind=kind, record_id=record_id) from None
        return envelope

    def compare_and_set(
        self, envelope: Envelope, expected_version: int, *, fence: Fence | None = None
    ) -> bool:
        """Replace the record if its version is ``expected_version``: one conditional UPDATE
        (fenced: also no newer grant of ``fence.lease``); an already-applied retry is True."""
        check_envelope(envelope)
        if type(expected_version) is not int or envelope.version != expected_version + 1:
            raise SagaValidationError("the new version must be expected_version + 1")
        if fence is not None:
            check_fence(fence)
        params: dict[str, Any] = {
            "p_kind": envelope.kind,
            "p_id": envelope.id,
            "p_expected": expected_version,
            "p_version": envelope.version,
            "p_state": envelope.state,
            "p_updated": envelope.updated_at_ms,
            "p_body": envelope.body,
        }
        stmt = self._statements.cas
        if fence is not None:
            stmt = self._statements.fenced_cas
            params.update(p_lease=fence.lease, p_fence=fence.number)
        with self._driver_errors("compare_and_set"):
            with self._engine.begin() as conn:
                if conn.execute(stmt, params).rowcount == 1:
                    return True
            return self._already_applied(envelope, fence)

    def _already_applied(self, envelope: Envelope, fence: Fence | None) -> bool:
        """After a refused CAS: raise if fenced out, else True only if the row is ``envelope``."""
        table, leases = self._tables.envelopes, self._tables.leases
        with self._engine.begin() as conn:
            if fence is not None:
                newest = conn.execute(
                    select(leases.c.fence).where(leases.c.name == fence.lease)
                ).scalar_one_or_none()
                if newest is not None and newest > fence.number:
                    raise FencedWriteRefused(lease=fence.lease, fence=fence.number)
            row = conn.execute(
                select(*_record_columns(table)).where(
                    table.c.kind == envelope.kind, table.c.id == envelope.id
                )
            ).one_or_none()
        return row is not None and tuple(row) == (
            envelope.id,
            envelope.version,
            envelope.state,
            envelope.updated_at_ms,
            envelope.body,
        )

    def scan(
        self,
        kind: str,
        states: Sequence[str],
        *,
        updated_before_ms: int | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> Page:
        """One index-backed query: up to ``limit`` records of ``kind`` in ``states`` (walked in
        the order given, oldest first), keyset-paged after the opaque ``cursor``."""
        check_scan_args(kind, states, limit, updated_before_ms)
        states = list(dict.fromkeys(states))  # a state named twice is walked once
        start, after, _ = decode_cursor(cursor, states)
        stmt = self._scan_statement(kind, states[start:], after, updated_before_ms, limit + 1)
        with self._driver_errors("scan"), self._engine.begin() as conn:
            rows = conn.execute(stmt).all()
        # Values are not judged here (a wrongly typed row still raises): the caller decodes
        # each record and reports a corrupt one, so one bad row cannot stall every sweep.
        items = tuple(_envelope(kind, row) for row in rows[:limit])
        if len(rows) <= limit:
            return Page(items, None)
        last = items[-1]
        return Page(items, encode_cursor(states, last.state, (last.updated_at_ms, last.id)))

    def _scan_statement(
        self,
        kind: str,
        states: Sequence[str],
        after: tuple[int, str] | None,
        updated_before_ms: int | None,
        fetch: int,
    ) -> Select[Any]:
        table = self._tables.envelopes
        members = []
        for state in states:
            member = select(*_record_columns(table)).where(table.c.kind == kind, table.c.state == state)
            if after is not None:
                # ">=" is the index range; the OR only drops ties already returned
                member = member.where(
                    table.c.updated_at_ms >= after[0],
                    or_(table.c.updated_at_ms > after[0], table.c.id > after[1]),
                )
                after = None
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

    def acquire_lease(
        self, name: str, owner: str, token: str, now_ms: int, lease_ms: int
    ) -> Lease | None:
        """Grant the lease unless an unexpired one exists; the fence grows by one per grant.

        One conditional UPDATE; only the very first grant of a name inserts its row instead.
        """
        check_lease_args(name, owner, token)
        expires = _expiry(now_ms, lease_ms)
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
                return Lease(name, owner, token, expires, row.fence, row.scan_cursor)
            first = {
                "name": name,
                "owner": owner,
                "token_hash": digest,
                "expires_at_ms": expires,
                "fence": 1,
                "scan_cursor": None,
            }
            if insert_if_absent(self._engine, leases, first):
                return Lease(name, owner, token, expires, 1, None)
        return None

    def renew_lease(self, lease: Lease, now_ms: int, lease_ms: int) -> Lease | None:
        """Extend an unexpired lease held with this owner and token (one UPDATE)."""
        check_lease_args(lease.name, lease.owner, lease.token)
        expires = _expiry(now_ms, lease_ms)
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
        return Lease(lease.name, lease.owner, lease.token, expires, row.fence, row.scan_cursor)

    def checkpoint_lease(self, lease: Lease, cursor: str | None, now_ms: int) -> bool:
        """Save the scan cursor of an unexpired lease held with this owner and token."""
        check_lease_args(lease.name, lease.owner, lease.token)
        if cursor is not None and not isinstance(cursor, str):
            raise SagaValidationError("lease cursor must be a str or None")
        timestamp_ms(now_ms, field="now_ms")
        leases = self._tables.leases
        stmt = (
            update(leases)
            .where(self._holder(lease), leases.c.expires_at_ms > now_ms)
            .values(scan_cursor=cursor)
        )
        with self._driver_errors("checkpoint_lease"), self._engine.begin() as conn:
            return conn.execute(stmt).rowcount == 1

    def release_lease(self, lease: Lease) -> bool:
        """Free the lease if held with this owner and token; the fence and cursor stay."""
        check_lease_args(lease.name, lease.owner, lease.token)
        leases = self._tables.leases
        stmt = (
            update(leases)
            .where(self._holder(lease))
            .values(owner=None, token_hash=None, expires_at_ms=0)
        )
        with self._driver_errors("release_lease"), self._engine.begin() as conn:
            return conn.execute(stmt).rowcount == 1

    def _holder(self, lease: Lease) -> Any:
        leases = self._tables.leases
        return and_(
            leases.c.name == lease.name,
            leases.c.owner == lease.owner,
            leases.c.token_hash == _token_hash(lease.token),
        )

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
        self.get: Select[Any] = select(*_record_columns(table)).where(
            table.c.kind == bindparam("p_kind"), table.c.id == bindparam("p_id")
        )
        self.cas: Update = (
            update(table)
            .where(
                table.c.kind == bindparam("p_kind"),
                table.c.id == bindparam("p_id"),
                table.c.version == bindparam("p_expected"),
            )
            .values(
                version=bindparam("p_version"),
                state=bindparam("p_state"),
                updated_at_ms=bindparam("p_updated"),
                body=bindparam("p_body"),
            )
        )
        newer = exists().where(
            leases.c.name == bindparam("p_lease"), leases.c.fence > bindparam("p_fence")
        )
        self.fenced_cas: Update = self.cas.where(~newer)


def _record_columns(table: Any) -> tuple[Any, ...]:
    return (table.c.id, table.c.version, table.c.state, table.c.updated_at_ms, table.c.body)


def _lease_columns(table: Any) -> tuple[Any, ...]:
    return (table.c.fence, table.c.scan_cursor)


def _row(envelope: Envelope, *, keys: bool = True) -> dict[str, Any]:
    row: dict[str, Any] = {
        "version": envelope.version,
        "state": envelope.state,
        "updated_at_ms": envelope.updated_at_ms,
        "body": envelope.body,
    }
    if keys:
        row.update(kind=envelope.kind, id=envelope.id)
    return row


def _envelope(kind: str, row: Row[Any]) -> Envelope:
    """An envelope from a row; a row whose columns have the wrong types is an invalid record."""
    record_id, version, state, updated_at_ms, body = tuple(row)
    if not (
        type(version) is int
        and type(updated_at_ms) is int
        and isinstance(state, str)
        and isinstance(body, str)
    ):
        raise InvalidRecordError(kind=kind, record_id=str(record_id))
    return Envelope(kind, record_id, version, state, updated_at_ms, body)


def _expiry(now_ms: int, lease_ms: int) -> int:
    timestamp_ms(now_ms, field="now_ms")
    duration_ms(lease_ms, field="lease_ms")
    return timestamp_ms(now_ms + lease_ms, field="lease expiry")


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
