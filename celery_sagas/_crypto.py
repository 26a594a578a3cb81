"""Payload encryption at rest with Fernet keys, newest first (docs/design.md §7).

``Sealer`` encrypts with the first key and decrypts with any listed key, so keys rotate
without downtime: list the new key everywhere, then drop the old one once nothing needs it.
The keys live only inside the ``cryptography`` objects; nothing here prints, logs or repeats
them (an invalid key is named by its position in the list, never by its value).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .errors import SagaConfigurationError

__all__ = ["Sealer", "sealer_of"]

_HINT = "32 url-safe base64-encoded bytes, as cryptography's Fernet.generate_key() makes"


def _fernet_classes() -> tuple[Any, Any, type[Exception]]:
    try:
        from cryptography.fernet import Fernet, InvalidToken, MultiFernet
    except ImportError:
        raise SagaConfigurationError(
            "encryption_keys need the 'cryptography' package: pip install 'celery-sagas[crypto]'"
        ) from None
    return Fernet, MultiFernet, InvalidToken


class Sealer:
    """Encrypts text with the newest key and decrypts text sealed with any listed key."""

    __slots__ = ("_invalid", "_multi", "_newest", "key_count")

    def __init__(self, keys: Sequence[str | bytes]) -> None:
        fernet, multi, invalid = _fernet_classes()
        if isinstance(keys, (str, bytes)) or not isinstance(keys, Sequence) or not keys:
            raise SagaConfigurationError("sagas_encryption_keys must be a non-empty list of Fernet keys")
        opened = []
        for index, key in enumerate(keys):
            if not isinstance(key, (str, bytes)):
                raise SagaConfigurationError(f"sagas_encryption_keys[{index}] must be a str or bytes")
            try:
                opened.append(fernet(key))
            except (ValueError, TypeError):
                # The message never repeats the key (nor chains the error that might).
                raise SagaConfigurationError(
                    f"sagas_encryption_keys[{index}] is not a Fernet key ({_HINT})"
                ) from None
        self._multi = multi(opened)
        self._newest = opened[0]
        self._invalid = invalid
        self.key_count = len(opened)

    def seal(self, text: str) -> str:
        """``text`` encrypted with the newest key, as an ASCII Fernet token."""
        token: bytes = self._multi.encrypt(text.encode("utf-8"))
        return token.decode("ascii")

    def open(self, token: str) -> str | None:
        """The text sealed in ``token``, or None when no listed key decrypts it."""
        try:
            plain: bytes = self._multi.decrypt(token.encode("ascii"))
        except (self._invalid, UnicodeError, ValueError, TypeError):
            return None
        return plain.decode("utf-8")

    def is_newest(self, token: str) -> bool:
        """Whether ``token`` was sealed with the newest key."""
        try:
            self._newest.decrypt(token.encode("ascii"))
        except (self._invalid, UnicodeError, ValueError, TypeError):
            return False
        return True

    def __repr__(self) -> str:
        return f"Sealer(<{self.key_count} keys hidden>)"


def sealer_of(keys: Sequence[str | bytes]) -> Sealer | None:
    """A sealer over ``keys``, or None when there are none (encryption off)."""
    return Sealer(keys) if keys else None
