"""Signed, expiring resume tokens for human approvals (docs/design.md §3.8).

Pure: no I/O, clock or randomness.

A token is a bearer credential: whoever holds it may resume the approval it names, once. The
gate shows it to the requester exactly once and stores only ``token_hash(token)``. Time and the
nonce come from the caller, so this module is deterministic and fully testable.

Wire format (ASCII, at most 2048 bytes)::

    token     = "v1." claims "." signature
    claims    = base64url(JSON {"aid": approval id, "exp": expiry ms, "n": nonce, "v": 1})
    signature = base64url(HMAC-SHA-256(key, "v1." claims))          (43 characters)
    key       = HMAC-SHA-256(secret, "celery_sagas.approvals.tokens/v1")

base64url carries no padding; the JSON has sorted keys and no whitespace. The key is derived
per secret so a secret shared with another purpose never signs approval tokens directly.

``verify`` checks, in this order and before trusting any byte: type and length, exact format,
the signature (constant time, against every secret), then the claims (canonical encoding, exact
key set, types, values), then expiry. Any failure is ``ApprovalTokenInvalid`` or
``ApprovalTokenExpired``; no other exception escapes, whatever the token is.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NoReturn

from .. import _values as values
from ..errors import ApprovalTokenExpired, ApprovalTokenInvalid, SagaValidationError

__all__ = [
    "MAX_TOKEN_BYTES",
    "MIN_SECRET_BYTES",
    "TOKEN_VERSION",
    "Claims",
    "TokenSigner",
    "token_hash",
]

TOKEN_VERSION = 1
MAX_TOKEN_BYTES = 2048
MIN_SECRET_BYTES = 32

_PREFIX = b"v1."
_KEY_LABEL = b"celery_sagas.approvals.tokens/v1"
_CLAIM_KEYS = frozenset({"aid", "exp", "n", "v"})
_FORMAT = re.compile(r"v1\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]{43}")


@dataclass(frozen=True, slots=True)
class Claims:
    """The verified claims of a resume token."""

    version: int
    approval_id: str
    nonce: str = field(repr=False)
    expires_at_ms: int


class TokenSigner:
    """Mints and verifies resume tokens; the first (newest) secret signs, every secret verifies."""

    __slots__ = ("_keys",)

    def __init__(self, secrets: Sequence[bytes | str]) -> None:
        self._keys = _derive_keys(secrets)

    def __repr__(self) -> str:
        return f"TokenSigner(<{len(self._keys)} secret(s) hidden>)"

    def __reduce__(self) -> NoReturn:
        raise TypeError("a TokenSigner holds secrets and is never pickled")

    def mint(self, *, approval_id: str, nonce: str, expires_at_ms: int) -> str:
        """Sign the claims of one approval; show the token once and store only its hash."""
        return self.remint(approval_id=approval_id, nonce=nonce, expires_at_ms=expires_at_ms)[0]

    def remint(self, *, approval_id: str, nonce: str, expires_at_ms: int) -> list[str]:
        """The token for these claims under every secret, newest first (to show it again)."""
        claims = Claims(
            version=TOKEN_VERSION,
            approval_id=values.approval_id(approval_id),
            nonce=values.nonce(nonce),
            expires_at_ms=values.timestamp_ms(expires_at_ms, field="expires at"),
        )
        signed = _PREFIX + _b64encode(_canonical(claims))
        return [(signed + b"." + _signature(key, signed)).decode("ascii") for key in self._keys]

    def verify(self, token: object, *, now_ms: int) -> Claims:
        """Return the claims of an authentic, unexpired token; raise an approval token error."""
        now = values.timestamp_ms(now_ms, field="now")
        signed, signature = _split(token)
        if not self._authentic(signed, signature):
            _invalid("signature does not verify")
        claims = _parse_claims(signed[len(_PREFIX) :])
        if now >= claims.expires_at_ms:
            raise ApprovalTokenExpired(
                f"approval {claims.approval_id!r} token expired at {claims.expires_at_ms}",
                approval_id=claims.approval_id,
                expires_at_ms=claims.expires_at_ms,
            )
        return claims

    def _authentic(self, signed: bytes, signature: bytes) -> bool:
        # Every key is tried (no early exit), so timing says nothing about which secret signed.
        matched = False
        for key in self._keys:
            matched |= hmac.compare_digest(_signature(key, signed), signature)
        return matched


def token_hash(token: str) -> str:
    """The SHA-256 hex digest of a token: the only form of it that is ever stored."""
    if not isinstance(token, str):
        raise SagaValidationError("approval token must be a str")
    # str.encode, not token.encode: a subclass must not choose the bytes (as in ``_split``).
    return hashlib.sha256(str.encode(token, "utf-8", "surrogatepass")).hexdigest()


def _derive_keys(secrets: Sequence[bytes | str]) -> tuple[bytes, ...]:
    if isinstance(secrets, (str, bytes, bytearray)) or not isinstance(secrets, Sequence):
        raise SagaValidationError("approval secrets must be a list of secrets, newest first")
    if not secrets:
        raise SagaValidationError("at least one approval secret is required")
    return tuple(_derive_key(secret, index) for index, secret in enumerate(secrets))


def _derive_key(secret: object, index: int) -> bytes:
    # Messages name the position and size of a bad secret, never its content.
    if isinstance(secret, str):
        try:
            secret = secret.encode("utf-8")
        except UnicodeEncodeError:
            raise SagaValidationError(f"approval secret #{index} is not valid text") from None
    if not isinstance(secret, bytes):
        raise SagaValidationError(f"approval secret #{index} must be bytes or str")
    if len(secret) < MIN_SECRET_BYTES:
        raise SagaValidationError(
            f"approval secret #{index} has {len(secret)} bytes; "
            f"at least {MIN_SECRET_BYTES} random bytes are required"
        )
    return hmac.new(secret, _KEY_LABEL, hashlib.sha256).digest()


def _canonical(claims: Claims) -> bytes:
    body = {
        "aid": claims.approval_id,
        "exp": claims.expires_at_ms,
        "n": claims.nonce,
        "v": claims.version,
    }
    return values.encode_json(body, field="claims").encode("utf-8")


def _b64encode(raw: bytes) -> bytes:
    return base64.urlsafe_b64encode(raw).rstrip(b"=")


def _signature(key: bytes, signed: bytes) -> bytes:
    return _b64encode(hmac.new(key, signed, hashlib.sha256).digest())


def _invalid(reason: str) -> NoReturn:
    # ``from None``: a chained decoder error could quote token bytes in a traceback.
    raise ApprovalTokenInvalid(f"approval token is invalid: {reason}") from None


def _split(token: object) -> tuple[bytes, bytes]:
    if not isinstance(token, str):
        _invalid("not a str")
    text = str.__str__(token)  # an exact str: a subclass cannot override what we read
    if len(text) > MAX_TOKEN_BYTES:
        _invalid(f"longer than {MAX_TOKEN_BYTES} bytes")
    if not text.isascii() or not _FORMAT.fullmatch(text):
        _invalid("malformed")
    signed, _, signature = text.rpartition(".")
    return signed.encode("ascii"), signature.encode("ascii")


def _parse_claims(segment: bytes) -> Claims:
    try:
        raw = base64.urlsafe_b64decode(segment + b"=" * (-len(segment) % 4))
        claims = _claims_from(values.decode_json(raw.decode("utf-8")))
        canonical = _b64encode(_canonical(claims)) == segment
    except (ValueError, RecursionError):  # SagaValidationError is a ValueError
        _invalid("malformed claims")
    if not canonical:
        _invalid("claims are not canonically encoded")
    return claims


def _claims_from(data: object) -> Claims:
    if not isinstance(data, dict) or data.keys() != _CLAIM_KEYS:
        raise ValueError("claims must be an object with exactly aid, exp, n and v")
    version = data["v"]
    if type(version) is not int or version != TOKEN_VERSION:
        raise ValueError("unsupported claims version")
    return Claims(
        version=version,
        approval_id=values.approval_id(data["aid"]),
        nonce=values.nonce(data["n"]),
        expires_at_ms=values.timestamp_ms(data["exp"], field="expires at"),
    )
