"""Operator commands: ``celery -A proj sagas …`` (a Celery CLI plugin) and ``celery-sagas --app proj …``.

Both run the same commands against the ``Sagas`` created on the app (``sagas_of(app)``):
``list``, ``show``, ``history``, ``export``, ``findings``, ``resolve``, ``approve``, ``deny``,
``cancel``, ``resume``, ``sweep``, ``reseal`` and ``reindex``, plus ``web`` (the operator web
UI). Output is a table for people, or JSON with ``--json``. Acting commands take ``--actor``
(default: the OS user) and ``--reason``, kept in the saga's history. Exit codes:

    0  done                      3  no such saga or approval
    1  refused (nothing changed) 4  the store or the broker failed
    2  usage error (bad option, bad id, no Sagas on the app)
"""

from __future__ import annotations

import functools
import getpass
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, NoReturn, TypeVar

import click
from celery import Celery
from kombu.exceptions import OperationalError

from . import _cli_format as fmt
from . import _history_format as hfmt
from ._celery.facade import Sagas, sagas_of
from ._cli_export import export_line, export_target
from ._error_kinds import ErrorKind, error_kind
from ._findings import REPORTS
from ._records import SAGA, SagaHistory, SagaRecord, SagaState
from ._scans import BROWSE_ORDERS
from .errors import SagaConfigurationError, SagaError, SagaNotFound
from .stores.base import MAX_SCAN_LIMIT, IdIndexing

__all__ = [
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "Session",
    "main",
    "sagas",
]

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_UNAVAILABLE = 4
_EXIT_CODES = {
    ErrorKind.NOT_FOUND: EXIT_NOT_FOUND,
    ErrorKind.INVALID: EXIT_USAGE,
    ErrorKind.MISCONFIGURED: EXIT_USAGE,
    ErrorKind.UNAVAILABLE: EXIT_UNAVAILABLE,
    ErrorKind.REFUSED: EXIT_REFUSED,
}

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class Session:
    """The app a command runs against (given, or loaded lazily from ``--app``) and its Sagas."""

    app: Celery | None = None
    app_path: str | None = None
    _sagas: Sagas | None = field(default=None, repr=False)

    @property
    def sagas(self) -> Sagas:
        """The Sagas created on the app; importing the app's task modules if need be."""
        if self._sagas is None:
            app = self._load()
            try:
                self._sagas = sagas_of(app)
            except SagaConfigurationError:
                app.loader.import_default_modules()
                self._sagas = sagas_of(app)
        return self._sagas

    def _load(self) -> Celery:
        if self.app is None:
            if not self.app_path:
                raise click.UsageError("name the app: --app proj (or CELERY_SAGAS_APP=proj)")
            from celery.app.utils import find_app

            try:
                self.app = find_app(self.app_path)
            except Exception as exc:
                raise click.UsageError(f"cannot load app {self.app_path!r}: {exc}") from exc
        return self.app


def _session(ctx: click.Context) -> Session:
    session = ctx.find_object(Session)
    if session is None:
        raise click.UsageError("no app: run as `celery -A proj sagas …` or `celery-sagas --app proj …`")
    return session


def _fail(message: str, code: int) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    raise click.exceptions.Exit(code)


def exit_code(exc: BaseException) -> int | None:
    """The exit code an error maps to, or None for one the CLI does not translate."""
    if isinstance(exc, SagaError):
        return _EXIT_CODES[error_kind(exc)]
    if isinstance(exc, (OperationalError, ConnectionError)):  # the broker failed
        return EXIT_UNAVAILABLE
    return None


def _operation(func: F) -> F:
    """Turn library errors into one line on stderr and a meaningful exit code."""

    @functools.wraps(func)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except click.ClickException:
            raise
        except Exception as exc:
            code = exit_code(exc)
            if code is None:
                raise
            _fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__, code)

    return guarded  # type: ignore[return-value]


def _emit(as_json: bool, data: Any, text: str) -> None:
    click.echo(fmt.dumps(data) if as_json else text)


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
cursor_option = click.option("--cursor", help="Continue where a previous page stopped (its `cursor`).")


def _limit_option(default: int, what: str) -> Callable[[F], F]:
    return click.option("--limit", type=click.IntRange(1, MAX_SCAN_LIMIT), default=default,
                        show_default=True, help=f"At most this many {what}.")


# ---------------------------------------------------------------- reading


@click.command("list")
@click.option("--state", type=click.Choice([str(s) for s in SagaState]),
              help="Only sagas in this state (default: every state).")
@click.option("--definition", help="Only sagas of this definition.")
@click.option("--sort", "order", type=click.Choice(list(BROWSE_ORDERS)),
              help="Across states by last write (newest, oldest) or by creation "
                   "(newest-created, oldest-created) (default: state by state, oldest first).")
@_limit_option(50, "sagas")
@cursor_option
@json_option
@click.pass_context
@_operation
def list_sagas(ctx: click.Context, state: str | None, definition: str | None, order: str | None,
               limit: int, cursor: str | None, as_json: bool) -> None:
    """List sagas (ids, states, error codes; never payloads)."""
    page = _session(ctx).sagas.browse(states=[state] if state else None, definition=definition,
                                      cursor=cursor, limit=limit, order=order)
    found, corrupt, cursor = list(page.records), list(page.corrupt), page.cursor
    data = {"sagas": [fmt.saga_summary(r) for r in found], "cursor": cursor,
            "corrupt": [fmt.corrupt_view(c) for c in corrupt]}
    text = fmt.saga_table(found) if found else "no sagas"
    text += "".join(f"\ncorrupt saga record {c.id!r}: {fmt.printable(c.reason)}" for c in corrupt)
    if cursor is not None:
        text += f"\nmore: --cursor {cursor}"
    _emit(as_json, data, text)


@click.command("show")
@click.argument("saga_id")
@click.option("--payload", is_flag=True,
              help="Also print the saga input, step arguments and (in the table) step results.")
@json_option
@click.pass_context
@_operation
def show(ctx: click.Context, saga_id: str, payload: bool, as_json: bool) -> None:
    """Show a saga's steps as a timeline, then what happened to it.

    Each step shows its state, attempts, effect id, error code and forward times (started,
    committed), then its compensation effect id and the compensator's own times (started,
    compensated). Then the saga's history without routine step progress: failures,
    ambiguities and their causes, changes of state, waits, signals, children, approvals and
    every operator action with who and why (all of it: `history`). --json includes each
    step's result (operators need them to resolve) and the whole history; the saga input and
    step arguments appear only with --payload.
    """
    record = _session(ctx).sagas.get(saga_id)
    if record is None:
        raise SagaNotFound(saga_id=saga_id)
    found = SagaHistory(record.saga_id, tuple(record.history), record.history_folded)
    view = {**fmt.saga_view(record, payload=payload), "history": found.to_dict()}
    text = f"{fmt.saga_text(record, payload=payload)}\n\n{hfmt.events_text(found)}"
    _emit(as_json, view, text)


@click.command("history")
@click.argument("saga_id")
@json_option
@click.pass_context
@_operation
def history(ctx: click.Context, saga_id: str, as_json: bool) -> None:
    """Show what happened to a saga, oldest first.

    Every transition (intent, claim, commit, failure, ambiguity and its cause, retries,
    compensation, changes of state, signals, timers, children, approvals) and every operator
    action with who did it and why; never rewritten. Holds no payloads.
    """
    found = _session(ctx).sagas.history(saga_id)
    _emit(as_json, found.to_dict(), hfmt.history_text(found))


def _states_option(value: str | None) -> list[SagaState] | None:
    if not value:
        return None
    try:
        return [SagaState(name.strip()) for name in value.split(",") if name.strip()]
    except ValueError:
        names = ", ".join(str(s) for s in SagaState)
        raise click.BadParameter(f"states are {names}", param_hint="--state") from None


def _before_option(value: str | None) -> int | None:
    """An ISO 8601 time (UTC unless it names its offset) as epoch milliseconds."""
    if value is None:
        return None
    text = value[:-1] + "+00:00" if value.endswith(("Z", "z")) else value  # 3.10 lacks "Z"
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter("an ISO 8601 time, e.g. 2026-01-31T00:00:00Z",
                                 param_hint="--before") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return max(0, int(moment.timestamp() * 1000))


_EXPORT_PAGE = 500  # sagas read per page: the total is --limit


@click.command("export")
@click.option("--state", "states", metavar="S,...",
              help="Only sagas in these states, comma-separated (default: every state).")
@click.option("--before", metavar="TIME",
              help="Only sagas last written before this ISO 8601 time (UTC unless it says).")
@click.option("--definition", help="Only sagas of this definition.")
@click.option("--output", type=click.Path(dir_okay=False, writable=True),
              help="Write to this file instead of stdout (replaced only once the export is whole).")
@click.option("--limit", type=click.IntRange(min=1), default=None,
              help="At most this many sagas in all, as in list (default: every one).")
@click.option("--keep-sealed", is_flag=True,
              help="Write a saga no configured key decrypts in its sealed form (a 'sealed' "
                   "object) instead of refusing.")
@click.pass_context
@_operation
def export(ctx: click.Context, states: str | None, before: str | None, definition: str | None,
           output: str | None, limit: int | None, keep_sealed: bool) -> None:
    """Write full saga records as JSON lines, for audits and migrations.

    One line per saga with every field: input, steps with their arguments and results, state,
    times. The store's indexes do the filtering, a page at a time, state by state, oldest first.
    Corrupt records are named on stderr and skipped. A saga no configured key decrypts stops
    the export (exit 1) unless --keep-sealed writes its sealed form.
    """
    sagas = _session(ctx).sagas
    wanted, before_ms = _states_option(states), _before_option(before)
    with export_target(output) as out:
        written, cursor = 0, None
        while limit is None or written < limit:
            page = sagas.browse(states=wanted, definition=definition, updated_before_ms=before_ms,
                                cursor=cursor, limit=min(_EXPORT_PAGE, limit or _EXPORT_PAGE))
            for record in page.records[:None if limit is None else limit - written]:
                line = export_line(record, sagas.store, keep_sealed=keep_sealed)
                if line is not None:
                    out.write(line + "\n")
                    written += 1
            for corrupt in page.corrupt:
                click.echo(f"corrupt saga record {corrupt.id!r} skipped: {corrupt.reason}", err=True)
            cursor = page.cursor
            if cursor is None:
                break
    if output:
        click.echo(f"exported {written} sagas to {output}", err=True)


@click.command("findings")
@click.option("--report", type=click.Choice(REPORTS), default="all", show_default=True,
              help="Sagas, their effects, or both.")
@_limit_option(100, "findings")
@cursor_option
@json_option
@click.pass_context
@_operation
def findings(ctx: click.Context, report: str, limit: int, cursor: str | None,
             as_json: bool) -> None:
    """Report what needs an operator.

    Sagas in manual review, running or compensating sagas idle past stale_after (a step in
    flight or unknown, or just stale), effects left unfinished or unknown, and corrupt
    records, each with the next thing to do.
    """
    page = _session(ctx).sagas.findings(report, cursor=cursor, limit=limit)
    data = {"findings": [fmt.finding_view(f) for f in page.findings], "cursor": page.cursor}
    text = fmt.findings_text(page.findings, ())
    if page.cursor is not None:
        text += f"\nmore: --cursor {page.cursor}"
    _emit(as_json, data, text)


@click.command("replay-check")
@click.option("--definition", help="Only sagas of this definition.")
@click.option("--limit", type=click.IntRange(min=1), default=None,
              help="Check at most this many sagas (default: every saga in flight).")
@json_option
@click.pass_context
@_operation
def replay_check(ctx: click.Context, definition: str | None, limit: int | None,
                 as_json: bool) -> None:
    """Check a deploy: replay this code's run() against every saga in flight.

    Lists the sagas the code would send to manual review as nondeterministic (a step
    reordered, renamed or given other arguments without ctx.patched) and exits 1 if there is
    any. Writes nothing and sends nothing: run it with the new code against production's store
    before the new code ships.
    """
    report = _session(ctx).sagas.replay_check(definition=definition, limit=limit)
    data = {"checked": report.checked, "ok": report.ok,
            "nondeterministic": [{"saga_id": d.saga_id, "definition": d.definition,
                                  "reason": fmt.printable(d.reason)} for d in report.divergences],
            "unreadable": [fmt.corrupt_view(c) for c in report.unreadable]}
    lines = [f"{report.checked} saga(s) in flight replayed; "
             f"{len(report.divergences)} would become nondeterministic"]
    lines += [f"  {d.saga_id} ({d.definition}): {fmt.printable(d.reason)}"
              for d in report.divergences]
    lines += [f"unreadable saga record {c.id!r}: {fmt.printable(c.reason)}"
              for c in report.unreadable]
    _emit(as_json, data, "\n".join(lines))
    if not report.ok:
        raise click.exceptions.Exit(EXIT_REFUSED)


# ---------------------------------------------------------------- acting


def _outcome(committed: bool, not_committed: bool, compensated: bool, not_compensated: bool) -> str:
    chosen = [name for name, flag in (("committed", committed), ("not-committed", not_committed),
                                      ("compensated", compensated),
                                      ("not-compensated", not_compensated)) if flag]
    if len(chosen) != 1:
        raise click.UsageError(
            "give exactly one of --committed, --not-committed, --compensated, --not-compensated"
        )
    return chosen[0]


def _json_result(text: str | None, hint: str = "--result") -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint=hint) from None


def _os_user() -> str:
    """Who runs the command, as the OS knows them (``--actor``'s default)."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError, ImportError):
        return f"uid-{os.getuid()}" if hasattr(os, "getuid") else "unknown"
    return user if user and user.isprintable() and " " not in user else "unknown"


def actor_options(func: F) -> F:
    """``--actor`` (default: the OS user) and ``--reason``: who acts and why, kept in the
    saga's history (docs/design.md §2.6)."""
    func = click.option("--reason", help="Why, in one line (kept in the saga's history).")(func)
    return click.option("--actor", default=_os_user, show_default="the OS user",
                        help="Who acts (kept in the saga's history).")(func)


def _changed(as_json: bool, record: SagaRecord, did: str) -> None:
    text = f"saga {record.saga_id} {did}: now {record.state}"
    if record.error_code:
        text += f" ({record.error_code})"
    _emit(as_json, fmt.saga_summary(record), text)


@click.command("resolve")
@click.argument("saga_id")
@click.option("--step", required=True, help="The step's name (see `show`).")
@click.option("--effect-id", required=True,
              help="The effect id you checked with the provider (compensation effect id for "
                   "--compensated/--not-compensated).")
@click.option("--committed", is_flag=True,
              help="The step's effect happened (needs --result; --result null for null).")
@click.option("--not-committed", is_flag=True, help="The step's effect provably did not happen.")
@click.option("--compensated", is_flag=True, help="The compensator's effect happened.")
@click.option("--not-compensated", is_flag=True, help="The compensator's effect did not happen.")
@click.option("--result", "result_json", metavar="JSON",
              help="With --committed (required there): the step's result as the provider "
                   "confirmed it.")
@click.option("--error-code", help="With --not-committed: why (default not_committed).")
@actor_options
@json_option
@click.pass_context
@_operation
def resolve(ctx: click.Context, saga_id: str, step: str, effect_id: str, committed: bool,
            not_committed: bool, compensated: bool, not_compensated: bool,
            result_json: str | None, error_code: str | None, actor: str, reason: str | None,
            as_json: bool) -> None:
    """Settle an ambiguous step or compensation.

    Ask the provider about the effect id first (it is the idempotency key the step used).
    A stale effect id, a step that is not ambiguous, or a final saga is refused (exit 1).
    """
    outcome = _outcome(committed, not_committed, compensated, not_compensated)
    if result_json is not None and outcome != "committed":
        raise click.UsageError("--result goes with --committed only")
    if result_json is None and outcome == "committed":
        raise click.UsageError("--committed needs --result JSON: the step's result as the provider "
                               "confirmed it (--result null when null is meant)")
    if error_code is not None and outcome != "not-committed":
        raise click.UsageError("--error-code goes with --not-committed only")
    if outcome == "not-committed" and error_code is None:
        error_code = "not_committed"
    record = _session(ctx).sagas.resolve(saga_id, step, effect_id, outcome,
                                         result=_json_result(result_json), error_code=error_code,
                                         actor=actor, reason=reason)
    _changed(as_json, record, f"step {step} resolved {outcome}")
    if not as_json and record.state is not SagaState.MANUAL_REVIEW and not record.state.final:
        click.echo(f"the sweep drives it on; to do it now: resume {saga_id}")


def _decide(ctx: click.Context, approval_id: str, tenant: str, by: str, decision: str,
            reason: str | None, as_json: bool) -> None:
    approvals = _session(ctx).sagas.approvals
    if approvals.get(approval_id) is None:
        _fail(f"no approval {approval_id!r}", EXIT_NOT_FOUND)
    record = approvals.decide(approval_id, tenant_id=tenant, decision=decision, decided_by=by,
                              reason=reason)
    _emit(as_json, fmt.approval_view(record), f"approval {record.approval_id} {record.state} by {by}")


def _approval_command(name: str, decision: str, summary: str) -> click.Command:
    @click.command(name, help=summary)
    @click.argument("approval_id")
    @click.option("--tenant", required=True, help="The tenant the approval belongs to.")
    @click.option("--actor", "--by", "decided_by", default=_os_user, show_default="the OS user",
                  help="Who decides (recorded on the approval and in the saga's history).")
    @click.option("--reason", help="Why, in one line (kept in the saga's history).")
    @json_option
    @click.pass_context
    @_operation
    def command(ctx: click.Context, approval_id: str, tenant: str, decided_by: str,
                reason: str | None, as_json: bool) -> None:
        _decide(ctx, approval_id, tenant, decided_by, decision, reason, as_json)

    return command


approve = _approval_command(
    "approve", "approved",
    "Approve a pending approval.\n\nOnly once, before it expires; the requester then resumes "
    "the saga with its token.",
)
deny = _approval_command(
    "deny", "denied",
    "Deny a pending approval.\n\nThe gated step counts as not committed: the saga compensates.",
)


def _refuse_final(sagas_: Sagas, saga_id: str, verb: str) -> None:
    """Exit 1 ("refused") for a final saga: ``verb`` would do nothing to it (the library call
    is a no-op that returns the record; the CLI says so instead of reporting success)."""
    record = sagas_.get(saga_id)
    if record is None:
        raise SagaNotFound(saga_id=saga_id)
    if record.state.final:
        _fail(f"saga {saga_id!r} is {record.state}: nothing to {verb} ({verb} refused)",
              EXIT_REFUSED)


@click.command("cancel")
@click.argument("saga_id")
@actor_options
@json_option
@click.pass_context
@_operation
def cancel(ctx: click.Context, saga_id: str, actor: str, reason: str | None,
           as_json: bool) -> None:
    """Stop a saga and compensate what committed.

    Forward progress stops at the next step boundary. A final saga is left as it is and the
    command is refused (exit 1).
    """
    sagas_ = _session(ctx).sagas
    _refuse_final(sagas_, saga_id, "cancel")
    _changed(as_json, sagas_.cancel(saga_id, actor=actor, reason=reason), "cancelled")


@click.command("resume")
@click.argument("saga_id")
@actor_options
@json_option
@click.pass_context
@_operation
def resume(ctx: click.Context, saga_id: str, actor: str, reason: str | None,
           as_json: bool) -> None:
    """Resume a saga after manual review.

    A running or compensating saga is driven on now (what the sweep would do). Refused (exit 1)
    while a step's outcome is still unknown (resolve it first) and for a final saga.
    """
    sagas_ = _session(ctx).sagas
    _refuse_final(sagas_, saga_id, "resume")
    _changed(as_json, sagas_.resume(saga_id, actor=actor, reason=reason), "resumed")


@click.command("signal")
@click.argument("saga_id")
@click.argument("name")
@click.option("--payload", "payload_json", metavar="JSON", help="The signal's payload (JSON).")
@click.option("--signal-id", help="Sending again with the same id is one signal.")
@actor_options
@json_option
@click.pass_context
@_operation
def signal(ctx: click.Context, saga_id: str, name: str, payload_json: str | None,
           signal_id: str | None, actor: str, reason: str | None, as_json: bool) -> None:
    """Send the signal NAME to a saga (ctx.wait_signal receives its payload).

    Refused (exit 1), nothing written: a completed or compensated saga (unless --signal-id
    repeats a signal it holds), or one at sagas_signal_limit / sagas_signal_bytes_limit.
    """
    payload = _json_result(payload_json, "--payload")
    record = _session(ctx).sagas.signal(saga_id, name, payload, signal_id=signal_id,
                                        actor=actor, reason=reason)
    _changed(as_json, record, f"signalled {name}")


@click.command("sweep")
@json_option
@click.pass_context
@_operation
def sweep(ctx: click.Context, as_json: bool) -> None:
    """Run one reconciliation pass now.

    Beat runs the same pass every sagas_sweep_interval seconds. Exit 1 when another
    sweeper holds the lease of a bucket (the others are swept: partial) or took one over
    during the pass (stopped early), 4 when the pass met errors (the report counts them; the
    worker log of the sweep names each record and cause).
    """
    report = _session(ctx).sagas.sweep()
    _emit(as_json, fmt.sweep_view(report), fmt.sweep_text(report))
    if not report.acquired or report.lease_lost or report.held:
        raise click.exceptions.Exit(EXIT_REFUSED)
    if report.errors:
        raise click.exceptions.Exit(EXIT_UNAVAILABLE)


@click.command("reseal")
@click.option("--state", type=click.Choice([str(s) for s in SagaState]),
              help="Only sagas in this state (default: every state).")
@_limit_option(100, "sagas per page")
@cursor_option
@click.option("--all", "every_page", is_flag=True, help="Walk every page, not just one.")
@json_option
@click.pass_context
@_operation
def reseal(ctx: click.Context, state: str | None, limit: int, cursor: str | None,
           every_page: bool, as_json: bool) -> None:
    """Re-encrypt sagas under the newest encryption key.

    Rewrites every saga of a page whose payloads are in clear or sealed with an older key
    (after a key rotation, before removing the old key). Exit 1 when some saga could not be
    read (a key is already missing, or the record is corrupt).
    """
    sagas_ = _session(ctx).sagas
    resealed = current = 0
    unreadable: list[str] = []
    while True:
        page = sagas_.reseal(states=[state] if state else None, cursor=cursor, limit=limit)
        resealed, current = resealed + page.resealed, current + page.current
        unreadable.extend(page.unreadable)
        cursor = page.cursor
        if cursor is None or not every_page:
            break
    data = {"resealed": resealed, "current": current, "unreadable": unreadable, "cursor": cursor}
    text = f"resealed {resealed}, already under the newest key {current}"
    text += "".join(f"\nunreadable saga {saga_id!r}" for saga_id in unreadable)
    if cursor is not None:
        text += f"\nmore: --cursor {cursor}"
    _emit(as_json, data, text)
    if unreadable:
        raise click.exceptions.Exit(EXIT_REFUSED)


@click.command("reindex")
@json_option
@click.pass_context
@_operation
def reindex(ctx: click.Context, as_json: bool) -> None:
    """Add sagas written before the store kept its id and creation indexes to them (once
    after an upgrade).

    The web UI's id-prefix search and its sort by creation read them. On Redis, sagas created
    by a version without them are found only after this command; on SQL, rows inserted
    before the created_at_ms column sort at their last write until it fills it. Either way a
    saga indexed here counts as created at its last write (its true creation time was never
    stored). Idempotent: run it again once the last process was upgraded; the memory store
    needs nothing (it reports 0).
    """
    store = _session(ctx).sagas.store
    added = store.index_ids(SAGA, [str(s) for s in SagaState]) \
        if isinstance(store, IdIndexing) else 0
    _emit(as_json, {"indexed": added}, f"indexed {added} saga ids")


@click.command("web")
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), default=8025, show_default=True,
              help="The port to listen on.")
@click.pass_context
@_operation
def web(ctx: click.Context, host: str, port: int) -> None:
    """Serve the operator web UI.

    Users come from CELERY_SAGAS_WEB_USERS (name:password:role,... with role operator or
    readonly) or the file named by CELERY_SAGAS_WEB_USERS_FILE; CSRF tokens are keyed by
    CELERY_SAGAS_WEB_SECRET. Needs the web extra (Flask).
    """
    import importlib.util

    if importlib.util.find_spec("flask") is None:
        _fail("the web UI needs Flask: pip install 'celery-sagas[web]'", EXIT_USAGE)
    from .web import create_app, serve

    serve(create_app(_session(ctx).sagas), host, port)


COMMANDS = (list_sagas, show, history, findings, replay_check, resolve, approve, deny, cancel, resume,
            signal, sweep, reseal, reindex)


# ---------------------------------------------------------------- the two entry points


@click.group("sagas")
@click.pass_context
def sagas(ctx: click.Context) -> None:
    """Inspect and operate sagas.

    Exit codes: 0 ok, 1 refused (nothing changed), 2 usage error, 3 not found,
    4 store or broker error.
    """
    if not isinstance(ctx.obj, Session):
        ctx.obj = Session(app=getattr(ctx.obj, "app", None))


@click.group("celery-sagas")
@click.option("-A", "--app", "app_path", envvar="CELERY_SAGAS_APP", metavar="MODULE[:APP]",
              help="The Celery app that creates Sagas, e.g. proj.celery:app (or CELERY_SAGAS_APP).")
@click.version_option(package_name="celery-sagas")
@click.pass_context
def main(ctx: click.Context, app_path: str | None) -> None:
    """Inspect and operate the sagas of a Celery app.

    Exit codes: 0 ok, 1 refused (nothing changed), 2 usage error, 3 not found,
    4 store or broker error.
    """
    ctx.obj = Session(app_path=app_path)


for _command in (*COMMANDS, export, web):
    sagas.add_command(_command)
    main.add_command(_command)
