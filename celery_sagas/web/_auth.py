"""Who may use the web UI: principals, HTTP basic users, and CSRF tokens.

Users come from ``CELERY_SAGAS_WEB_USERS`` (``name:password:role`` entries separated by
commas) or from the file named by ``CELERY_SAGAS_WEB_USERS_FILE`` (one entry per line, ``#``
starts a comment); a role is ``operator`` (sees and acts) or ``readonly`` (sees). Passwords
are compared in constant time and never logged, shown in a ``repr`` or quoted in an error.

A CSRF token belongs to one browser session (a random id in an HttpOnly, SameSite=Strict
cookie, replaced after every action) and expires (``CSRF_TTL_S``): it is the HMAC, under a
secret, of the principal, the session id and the time it was issued. The secret is
``CELERY_SAGAS_WEB_SECRET`` (shared by every process that serves the UI) or a random one per
process.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from werkzeug.wrappers import Request

from celery_sagas.errors import SagaConfigurationError, SagaValidationError

from .. import _values as values

__all__ = [
    "CSRF_TTL_S",
    "OPERATOR",
    "READONLY",
    "SECRET_ENV",
    "SESSION_COOKIE",
    "USERS_ENV",
    "USERS_FILE_ENV",
    "Authenticate",
    "BasicAuth",
    "CsrfTokens",
    "Principal",
    "WebUser",
    "new_session",
    "parse_users",
    "secret_from_environment",
    "session_id",
    "users_from_environment",
]

OPERATOR = "operator"
READONLY = "readonly"
ROLES = (OPERATOR, READONLY)
USERS_ENV = "CELERY_SAGAS_WEB_USERS"
USERS_FILE_ENV = "CELERY_SAGAS_WEB_USERS_FILE"
SECRET_ENV = "CELERY_SAGAS_WEB_SECRET"
MIN_SECRET_BYTES = 32
CSRF_TTL_S = 3600  # a form older than this is refused: reload the page
SESSION_COOKIE = "celery_sagas_session"
_CSRF_CONTEXT = b"celery_sagas.web/csrf/v2\x00"
_SKEW_S = 60  # a token issued this far in the future still counts (clocks of several processes)


@dataclass(frozen=True, slots=True)
class Principal:
    """Someone the UI let in: a name (recorded as who acted) and a role."""

    name: str
    role: str = READONLY

    def __post_init__(self) -> None:
        values.principal_id(self.name, field="web user name")
        if self.role not in ROLES:
            raise SagaValidationError(f"a web role is one of {', '.join(ROLES)}, got {self.role!r}")

    @property
    def can_act(self) -> bool:
        """True for operators: they see the forms and may post them."""
        return self.role == OPERATOR


Authenticate = Callable[[Request], Principal | None]


@dataclass(frozen=True, slots=True)
class WebUser:
    """A user of HTTP basic authentication (the password stays out of the ``repr``)."""

    name: str
    password: str = field(repr=False)
    role: str = READONLY

    def __post_init__(self) -> None:
        Principal(self.name, self.role)
        if not self.password:
            raise SagaValidationError(f"web user {self.name!r} has an empty password")


def parse_users(text: str, *, source: str, separator: str = ",") -> tuple[WebUser, ...]:
    """Users from ``name:password:role`` entries; errors name the entry, never the password."""
    users: list[WebUser] = []
    for number, entry in enumerate(text.split(separator), start=1):
        entry = entry.strip()
        if not entry or entry.startswith("#"):
            continue
        name, first, rest = entry.partition(":")
        password, last, role = rest.rpartition(":")
        if not (first and last):
            raise SagaConfigurationError(f"{source}: entry {number} is not name:password:role")
        try:
            users.append(WebUser(name, password, role))
        except SagaValidationError as exc:
            raise SagaConfigurationError(f"{source}: entry {number}: {exc}") from None
    names = [user.name for user in users]
    if len(set(names)) != len(names):
        raise SagaConfigurationError(f"{source}: a user name appears twice")
    return tuple(users)


def users_from_environment(environ: Mapping[str, str] = os.environ) -> tuple[WebUser, ...]:
    """The users named by ``CELERY_SAGAS_WEB_USERS`` or ``CELERY_SAGAS_WEB_USERS_FILE``."""
    inline, path = environ.get(USERS_ENV), environ.get(USERS_FILE_ENV)
    if inline and path:
        raise SagaConfigurationError(f"set {USERS_ENV} or {USERS_FILE_ENV}, not both")
    if path:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise SagaConfigurationError(f"{USERS_FILE_ENV}: cannot read {path!r}: "
                                         f"{type(exc).__name__}") from None
        return parse_users(text, source=USERS_FILE_ENV, separator="\n")
    return parse_users(inline or "", source=USERS_ENV)


def _digest(password: str) -> bytes:
    return hashlib.sha256(password.encode("utf-8", "surrogatepass")).digest()


class BasicAuth:
    """Checks HTTP basic credentials against fixed users, in constant time per request."""

    challenge = 'Basic realm="celery-sagas", charset="UTF-8"'

    def __init__(self, users: Iterable[WebUser]) -> None:
        self._users = {user.name: (_digest(user.password), user.role) for user in users}
        if not self._users:
            raise SagaConfigurationError(
                f"the web UI needs users: set {USERS_ENV}=name:password:role,... or "
                f"{USERS_FILE_ENV}, or pass users= or authenticate= to create_app"
            )
        self._unknown = _digest(secrets.token_hex(16))

    def __repr__(self) -> str:
        return f"BasicAuth({len(self._users)} users)"

    def __call__(self, request: Request) -> Principal | None:
        """The principal of valid basic credentials, or None."""
        given = request.authorization
        if given is None or given.type != "basic":
            return None
        name, password = given.username or "", given.password or ""
        digest, role = self._users.get(name, (self._unknown, READONLY))
        # The same comparison whether or not the name exists: timing tells nothing.
        matched = hmac.compare_digest(_digest(password), digest)
        return Principal(name, role) if matched and name in self._users else None


class CsrfTokens:
    """Per-session, expiring CSRF tokens: ``ISSUED.MAC`` with the MAC an HMAC-SHA-256 of the
    principal, the session id and ``ISSUED`` (seconds since the epoch)."""

    def __init__(self, secret: bytes | None = None, ttl_s: int = CSRF_TTL_S) -> None:
        if secret is not None and len(secret) < MIN_SECRET_BYTES:
            raise SagaConfigurationError(f"{SECRET_ENV} needs at least {MIN_SECRET_BYTES} bytes")
        self._key = secret if secret is not None else secrets.token_bytes(MIN_SECRET_BYTES)
        self.ttl_s = ttl_s

    def __repr__(self) -> str:
        return "CsrfTokens()"

    def _mac(self, principal: Principal, session: str, issued_s: int) -> str:
        message = _CSRF_CONTEXT + f"{principal.name}\x00{principal.role}\x00{session}\x00" \
            f"{issued_s}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def token_for(self, principal: Principal, session: str, now_s: int) -> str:
        """The token the forms of ``principal`` in ``session`` carry, issued at ``now_s``."""
        return f"{now_s}.{self._mac(principal, session, now_s)}"

    def valid(self, principal: Principal, session: str | None, token: object, now_s: int) -> bool:
        """True when ``token`` was issued to this principal in this session less than
        ``ttl_s`` ago (the MAC compared in constant time)."""
        if not session or not isinstance(token, str) or not token.isascii():
            return False
        issued, _, mac = token.partition(".")
        if not issued.isdigit() or len(issued) > 12:
            return False
        age = now_s - int(issued)
        if not -_SKEW_S <= age <= self.ttl_s:
            return False
        return hmac.compare_digest(mac.encode(), self._mac(principal, session, int(issued)).encode())


def new_session() -> str:
    """A fresh session id (what the session cookie holds)."""
    return secrets.token_hex(16)


def session_id(value: str | None) -> str | None:
    """The session id of a cookie's value, or None when it is not one of ours."""
    if value is None or len(value) != 32 or not all(c in "0123456789abcdef" for c in value):
        return None
    return value


def secret_from_environment(environ: Mapping[str, str] = os.environ) -> bytes | None:
    """The CSRF secret of ``CELERY_SAGAS_WEB_SECRET``, or None (a random one per process)."""
    secret = environ.get(SECRET_ENV)
    return secret.encode("utf-8") if secret else None
