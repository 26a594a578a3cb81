"""What an operator did through the UI: one ``OperatorAction`` per action, done or refused.

Each is logged on ``celery_sagas.web`` with structured ``extra`` fields (``web_action``,
``web_principal``, ``web_role``, ``saga_id``, ``approval_id``, ``web_outcome``) and handed to
the observers given to ``create_app(on_action=...)``. Ids, names and the error's class only:
never payloads, results, reasons or passwords. An id a refused request carried is unchecked,
so it is logged as its ``repr`` (a forged id cannot forge a log line).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._auth import Principal

__all__ = ["ActionObserver", "Announce", "OperatorAction", "announcer", "loggable"]

logger = logging.getLogger("celery_sagas.web")

DONE = "done"
REFUSED = "refused"


@dataclass(frozen=True, slots=True)
class OperatorAction:
    """One action an operator took in the UI: who, what, on which saga or approval, outcome."""

    action: str
    principal: str
    role: str
    saga_id: str | None
    approval_id: str | None
    outcome: str
    error: str | None = None

    @classmethod
    def of(cls, action: str, by: Principal, saga_id: str | None, approval_id: str | None,
           refused: str | None = None) -> OperatorAction:
        """The event of an action done (``refused`` None) or refused (``refused``: why, as the
        error's class name or ``read-only`` / ``csrf``)."""
        if refused is None:
            return cls(loggable(action) or "", by.name, by.role, saga_id, approval_id, DONE)
        return cls(loggable(action) or "", by.name, by.role, loggable(saga_id), loggable(approval_id),
                   REFUSED, refused)

    def log_fields(self) -> dict[str, str | None]:
        """The structured ``extra`` fields of this action's log record."""
        return {"web_action": self.action, "web_principal": self.principal, "web_role": self.role,
                "saga_id": self.saga_id, "approval_id": self.approval_id,
                "web_outcome": self.outcome, "error": self.error}


ActionObserver = Callable[[OperatorAction], None]
Announce = Callable[[OperatorAction], None]


def announcer(observers: Iterable[ActionObserver]) -> Announce:
    """Log each action and hand it to every observer (an observer that raises is logged)."""
    chosen = tuple(observers)

    def announce(event: OperatorAction) -> None:
        subject = event.saga_id or f"(approval {event.approval_id})"
        if event.outcome == DONE:
            logger.info("web: %s of saga %s by %s (%s)", event.action, subject, event.principal,
                        event.role, extra=event.log_fields())
        else:
            logger.warning("web: %s of saga %s by %s refused (%s)", event.action, subject,
                           event.principal, event.error, extra=event.log_fields())
        for observer in chosen:
            try:
                observer(event)
            except Exception:
                logger.exception("web: action observer %r failed", observer)

    return announce


def loggable(value: str | None) -> str | None:
    """``value`` as is when it could be an id (printable ASCII, 128 at most), else its repr."""
    if value is None:
        return None
    if len(value) <= 128 and value.isascii() and value.isprintable() and " " not in value:
        return value
    return repr(value[:128])
