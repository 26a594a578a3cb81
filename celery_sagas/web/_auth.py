"""Who may use the web UI: principals, HTTP basic users, and CSRF tokens.

Users come from ``CELERY_SAGAS_WEB_USERS`` (``name:password:role`` entries separated by
commas) or from the file named by ``CELERY_SAGAS_WEB_USERS_FILE`` (one entry per line, ``#``
starts a comment); a role is ``operator`` (sees and acts) or ``readonly`` (sees). Passwords
are compared in constant time and never logged, shown in a ``repr`` or quoted in an error.

A CSRF token is the HMAC of the principal under a secret: ``CELERY_SAGAS_WEB_SECRET`` (shared
by every process that serves the UI), or a random one per process.
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
    "OPERATOR",
    "READONLY",
    "SECRET_ENV",
    "USERS_ENV",
    "USERS_FILE_ENV",
    "Authenticate",
    "BasicAuth",
    "CsrfTokens",
    "Principal",
    "WebUser",
    "parse_users",
    "secret_from_environment",
    "users_from_environment",
]

OPERATOR = "operator"
READONLY = "readonly"
ROLES = (OPERATOR, READONLY)
USERS_ENV = "CELERY_SAGAS_WEB_USERS"
USERS_FILE_ENV = "CELERY_SAGAS_WEB_USERS_FILE"
SECRET_ENV = "CELERY_SAGAS_WEB_SECRET"
MIN_SECRET_BYTES = 32
_CSRF_CONTEXT = b"celery_sagas.web/csrf/v1\x00"


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
    """Per-principal CSRF tokens: HMAC-SHA-256 of the principal's name and role."""

    def __init__(self, secret: bytes | None = None) -> None:
        if secret is not None and len(secret) < MIN_SECRET_BYTES:
            raise SagaConfigurationError(f"{SECRET_ENV} needs at least {MIN_SECRET_BYTES} bytes")
        self._key = secret if secret is not None else secrets.token_bytes(MIN_SECRET_BYTES)

    def __repr__(self) -> str:
        return "CsrfTokens()"

    def token_for(self, principal: Principal) -> str:
        """The token every form of ``principal`` carries."""
        message = _CSRF_CONTEXT + f"{principal.name}\x00{principal.role}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def valid(self, principal: Principal, token: object) -> bool:
        """True when ``token`` is the principal's token (compared in constant time)."""
        if not isinstance(token, str) or not token.isascii():
            return False
        return hmac.compare_digest(token.encode(), self.token_for(principal).encode())


def secret_from_environment(environ: Mapping[str, str] = os.environ) -> bytes | None:
    """The CSRF secret of ``CELERY_SAGAS_WEB_SECRET``, or None (a random one per process)."""
    secret = environ.get(SECRET_ENV)
    return secret.encode("utf-8") if secret else None
