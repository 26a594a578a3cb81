"""Pure validators for every value that crosses the public surface (docs/design.md §2.5).

Each validator returns the value it accepted (normalised where noted) or raises
``SagaValidationError`` naming the field. Nothing here does I/O, so callers validate
everything before the first write.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import json
import math
import re
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ERROR_CODE_RULE, PayloadTooLarge, SagaValidationError

__all__ = [
    "DEFAULT_PAYLOAD_LIMIT",
    "MAX_REASON",
    "MAX_SAFE_INTEGER",
    "Matching",
    "Token",
    "actor",
    "approval_id",
    "capability",
    "change_id",
    "cursor_fields",
    "cursor_text",
    "decode_json",
    "definition_name",
    "digest",
    "duration_ms",
    "effect_id",
    "encode_json",
    "error_code",
    "exception_text",
    "identifier",
    "json_value",
    "nonce",
    "principal_id",
    "printable",
    "reason",
    "saga_id",
    "seconds_ms",
    "signal_id",
    "signal_name",
    "step_name",
    "target",
    "tenant_id",
    "timestamp_ms",
    "token",
    "traceback_text",
    "traceparent",
    "wait_seconds",
    "when_ms",
]

MAX_SAFE_INTEGER = 2**53 - 1
DEFAULT_PAYLOAD_LIMIT = 1024 * 1024

# Printable ASCII without space (docs/design.md §2.5).
_TOKEN = re.compile(r"[\x21-\x7e]+")
_CAPABILITY = re.compile(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*")
_DIGEST = re.compile(r"[0-9a-f]{64}")
_ERROR_CODE = re.compile(ERROR_CODE_RULE)
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}")
_NONCE = re.compile(r"[A-Za-z0-9_-]{16,64}")
# W3C trace context: version, trace id, parent span id, flags (lowercase hex).
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")


def printable(text: object) -> str:
    """``text`` with every control, format or other unprintable character escaped (``\\n``,
    ``\\x1b``, ``\\u202e``), for a log line or a table: an id or reason read from a store
    can then never forge another line or hide text. Printable text is returned as is."""
    value = str(text)
    if value.isprintable():
        return value
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in value)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def token(value: object, *, field: str, max_len: int) -> str:
    """Accept a non-empty printable-ASCII string without spaces, up to max_len."""
    if not isinstance(value, str):
        raise SagaValidationError(f"{field} must be a str, got {type(value).__name__}")
    if not 0 < len(value) <= max_len:
        raise SagaValidationError(f"{field} must have 1..{max_len} characters, got {len(value)}")
    if not _TOKEN.fullmatch(value):
        raise SagaValidationError(
            f"{field} must be printable ASCII without spaces: {_shown(value)}"
        )
    return value


MAX_REASON = 500  # characters of an operator's reason (docs/design.md §2.6)


def actor(value: object) -> str:
    """Who acted on a saga (an operator, a service): token of at most 128 characters."""
    return token(value, field="actor", max_len=128)


def reason(value: object) -> str:
    """The reason an operator gave: 1..500 printable characters (spaces allowed; no line
    breaks or control characters, so it can never forge a line where it is shown)."""
    if not isinstance(value, str):
        raise SagaValidationError(f"reason must be a str, got {type(value).__name__}")
    if not 0 < len(value) <= MAX_REASON:
        raise SagaValidationError(f"reason must have 1..{MAX_REASON} characters, got {len(value)}")
    if not value.isprintable():
        raise SagaValidationError(f"reason must be printable text on one line: {_shown(value)}")
    return value


@dataclass(frozen=True, slots=True)
class Token:
    """A validator of one kind of id or name: a ``token`` of at most ``max_len`` characters,
    named ``field`` in its errors."""

    field: str
    max_len: int = 128

    def __call__(self, value: object) -> str:
        """The value, accepted (SagaValidationError otherwise)."""
        return token(value, field=self.field, max_len=self.max_len)


# Ids and names (tokens of at most 128 characters unless said): the field each names in errors.
saga_id = Token("saga id")
definition_name = Token("definition name")
step_name = Token("step name")
signal_name = Token("signal name")
signal_id = Token("signal id")
change_id = Token("change id")  # a ``ctx.patched`` change id
approval_id = Token("approval id")
effect_id = Token("effect id", 64)
tenant_id = Token("tenant id", 255)


def principal_id(value: object, *, field: str = "principal id") -> str:
    """A principal id (or decided-by): token of at most 255 characters."""
    return token(value, field=field, max_len=255)


def target(value: object) -> str:
    """An approval or effect target: token of at most 128 characters."""
    return token(value, field="target", max_len=128)


def capability(value: object) -> str:
    """A lowercase dotted capability such as ``orders.charge``, at most 128 characters."""
    if not isinstance(value, str) or len(value) > 128 or not _CAPABILITY.fullmatch(value):
        raise SagaValidationError(f"capability must be a lowercase dotted name: {_shown(value)}")
    return value


@dataclass(frozen=True, slots=True)
class Matching:
    """A validator of strings that match ``pattern`` whole; ``rule`` (what a value must be)
    starts its error."""

    pattern: re.Pattern[str]
    rule: str

    def __call__(self, value: object) -> str:
        """The value, accepted (SagaValidationError otherwise)."""
        if not isinstance(value, str) or not self.pattern.fullmatch(value):
            raise SagaValidationError(f"{self.rule}: {_shown(value)}")
        return value


# A SHA-256 digest; an error code, kept as given (case too); a W3C ``traceparent`` header
# value (``00-<32 hex trace id>-<16 hex span id>-<2 hex flags>``).
digest = Matching(_DIGEST, "digest must be 64 lowercase hex characters")
error_code = Matching(_ERROR_CODE, f"error code must match {ERROR_CODE_RULE}")
traceparent = Matching(_TRACEPARENT, "trace parent must be a W3C traceparent")


MAX_EXCEPTION_TEXT = 1000
MAX_TRACEBACK_FRAMES = 8  # the innermost frames a traceback summary keeps
MAX_FRAME_TEXT = 120  # characters of one frame line (8 of them stay under 1,000)


def exception_text(exc: BaseException) -> str:
    """``"Type: message"`` of an exception raised by user code, at most 1000 characters (a
    message that cannot be turned into text is left out)."""
    name = type(exc).__name__
    try:
        message = str(exc)
    except Exception:
        message = ""
    text = f"{name}: {message}" if message else name
    text = text if text.isascii() else text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= MAX_EXCEPTION_TEXT else text[:MAX_EXCEPTION_TEXT - 3] + "..."


def traceback_text(exc: BaseException) -> str | None:
    """A bounded summary of where ``exc`` was raised: its innermost ``MAX_TRACEBACK_FRAMES``
    frames, innermost last, one ``"dir/file.py:line in function"`` line each (at most
    ``MAX_FRAME_TEXT`` characters), preceded by ``"... N earlier frames"`` when some were left
    out. File, line and function names only: never locals, arguments or source lines
    (docs/operations.md, "Metrics and logs"). None without a traceback."""
    try:
        frames = traceback.extract_tb(exc.__traceback__, limit=None) if exc.__traceback__ else []
    except Exception:
        return None
    if not frames:
        return None
    kept = frames[-MAX_TRACEBACK_FRAMES:]
    lines = [f"... {len(frames) - len(kept)} earlier frames"] if len(frames) > len(kept) else []
    for frame in kept:
        where = "/".join(frame.filename.replace("\\", "/").split("/")[-2:])
        line = f"{where}:{frame.lineno} in {frame.name}"
        line = line if line.isascii() else line.encode("ascii", "backslashreplace").decode()
        lines.append(line if len(line) <= MAX_FRAME_TEXT else "..." + line[-(MAX_FRAME_TEXT - 3):])
    return "\n".join(lines)


def identifier(value: object, *, field: str) -> str:
    """A short SQL/Redis-safe identifier (letters, digits, underscore; 32 characters)."""
    if not isinstance(value, str) or not _IDENTIFIER.fullmatch(value):
        raise SagaValidationError(
            f"{field} must be letters, digits and underscores (max 32): {_shown(value)}"
        )
    return value


def nonce(value: object) -> str:
    """An approval token nonce: 16..64 url-safe base64 characters (never echoed in errors)."""
    if not isinstance(value, str) or not _NONCE.fullmatch(value):
        raise SagaValidationError("nonce must be 16..64 url-safe base64 characters")
    return value


def _integer(value: object, *, field: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SagaValidationError(f"{field} must be an int, got {type(value).__name__}")
    if not low <= value <= MAX_SAFE_INTEGER:
        raise SagaValidationError(f"{field} must be in {low}..2**53-1, got {value}")
    return value


def timestamp_ms(value: object, *, field: str = "timestamp") -> int:
    """Integer milliseconds since the epoch, 0..2**53-1."""
    return _integer(value, field=field, low=0)


def plain_seconds(value: object) -> object:
    """A ``timedelta`` as its seconds (a float); anything else as given, for the caller to
    check: every duration the library takes is seconds or a ``timedelta``."""
    return value.total_seconds() if isinstance(value, datetime.timedelta) else value


def wait_seconds(value: object, name: str, *, allow_zero: bool) -> float:
    """A finite, non-negative (or positive) number of seconds or a ``timedelta``; NaN would
    never time out."""
    value = plain_seconds(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SagaValidationError(f"{name} must be a number of seconds, got {type(value).__name__}")
    seconds = float(value) if abs(value) < 1e300 else math.inf
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        raise SagaValidationError(f"{name} must be a finite {'non-negative' if allow_zero else 'positive'} "
                                  f"number of seconds, got {value!r}")
    return seconds


def duration_ms(value: object, *, field: str = "duration") -> int:
    """A positive integer number of milliseconds."""
    return _integer(value, field=field, low=1)


MAX_WAIT_SECONDS = 366 * 86_400  # the longest ctx.sleep (and how far ahead sleep_until may be)


def seconds_ms(value: object, *, field: str) -> int:
    """A finite number of seconds or a ``timedelta``, 0 to 366 days, as integer milliseconds."""
    value = plain_seconds(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SagaValidationError(
            f"{field} must be a number of seconds or a timedelta, got {type(value).__name__}")
    if not (math.isfinite(value) and 0 <= value <= MAX_WAIT_SECONDS):
        raise SagaValidationError(
            f"{field} must be 0..{MAX_WAIT_SECONDS} seconds (366 days), got {_shown(value)}")
    return math.ceil(value * 1000)


def when_ms(value: object, *, field: str) -> int:
    """A moment as integer milliseconds since the epoch: an aware ``datetime`` or epoch seconds."""
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise SagaValidationError(f"{field} must be an aware datetime (give it a tzinfo)")
        if value.timestamp() < 0:
            raise SagaValidationError(f"{field} must be from 1970 on, got {value.isoformat()}")
        return timestamp_ms(math.ceil(value.timestamp() * 1000), field=field)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SagaValidationError(f"{field} must be an aware datetime or epoch seconds")
    if not 0 <= value <= MAX_SAFE_INTEGER // 1000:
        raise SagaValidationError(
            f"{field} must be epoch seconds from 0 (1970) on, got {_shown(value)}")
    return timestamp_ms(math.ceil(value * 1000), field=field)


# Integers of more than 4300 digits are refused by int <-> str conversion (CPython's default
# sys.int_max_str_digits): json cannot write or read them.
_INT_BOUND = 10**4300
_MAX_DEPTH = 64


class _Refused(Exception):
    """A value JSON cannot carry, with the path to it once known."""

    def __init__(self, problem: str, path: str = "") -> None:
        super().__init__(problem)
        self.problem = problem
        self.path = path


def _key_shown(key: str) -> str:
    text = repr(key)
    return text if len(text) <= 24 else text[:21] + "..."


def _leaf(value: object) -> object:
    """A JSON scalar as it is, or _Refused."""
    if isinstance(value, str):
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise _Refused("contains a lone surrogate (not valid UTF-8)") from None
        return value
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if not -_INT_BOUND < value < _INT_BOUND:
            raise _Refused("contains an integer of more than 4300 digits")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _Refused("contains NaN or Infinity")
        return value
    raise _Refused(f"is not JSON-serialisable: {type(value).__name__}")


def _key(key: object) -> str:
    if not isinstance(key, str):
        raise _Refused("has a non-string object key")
    _leaf(key)
    return key


def _walk(value: object, depth: int, path: str | None) -> Any:
    """``value`` as JSON values; ``path`` (None on the fast path) locates a refusal."""
    if depth > _MAX_DEPTH:
        raise _Refused(f"is nested deeper than {_MAX_DEPTH} levels", path or "")
    if isinstance(value, (list, tuple)):
        if path is None:
            return [_walk(v, depth + 1, None) for v in value]
        return [_walk(v, depth + 1, _deeper(path, f"[{i}]")) for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        if path is None:
            return {_key(k): _walk(v, depth + 1, None) for k, v in value.items()}
        out = {}
        for k, v in value.items():
            here = _deeper(path, f"[{_key_shown(k)}]" if isinstance(k, str) else "[?]")
            try:
                out[_key(k)] = _walk(v, depth + 1, here)
            except _Refused as refused:
                refused.path = refused.path or here
                raise
        return out
    try:
        return _leaf(value)
    except _Refused as refused:
        refused.path = path or ""
        raise


def _deeper(path: str, part: str) -> str:
    """A path to show, cut in the middle past a few parts (it is for people, not parsers)."""
    return path + part if len(path) < 120 else path if path.endswith("...") else path + "..."


def _fast(value: object, depth: int) -> Any:
    """``_walk``'s fast path for the exact built-in types (most values); anything else, or
    anything to refuse, goes through ``_walk``."""
    if type(value) is str and value.isascii():
        return value
    if type(value) is dict and depth < _MAX_DEPTH:
        return {k if type(k) is str and k.isascii() else _key(k): _fast(v, depth + 1)
                for k, v in value.items()}
    if type(value) is list and depth < _MAX_DEPTH:
        return [_fast(v, depth + 1) for v in value]
    if type(value) is int and -_INT_BOUND < value < _INT_BOUND:
        return value
    if value is None or type(value) is bool:
        return value
    return _walk(value, depth, None)


def json_value(value: object, *, field: str = "payload") -> Any:
    """Accept only JSON values: str keys, finite floats, integers of at most 4300 digits,
    strings that are valid UTF-8, lists/tuples, at most 64 levels deep. The error names the
    field and the path to the value refused (``saga input["items"][3]``)."""
    try:
        return _fast(value, 0)
    except _Refused:
        pass
    try:
        _walk(value, 0, "")
    except _Refused as refused:
        raise SagaValidationError(f"{field}{refused.path} {refused.problem}") from None
    raise AssertionError("a refused value was accepted on the second walk")  # pragma: no cover


def encode_json(value: object, *, field: str = "payload", limit: int = DEFAULT_PAYLOAD_LIMIT) -> str:
    """Validate a JSON value and encode it canonically (sorted keys), within ``limit`` bytes."""
    text = json.dumps(
        json_value(value, field=field),
        allow_nan=False,
        ensure_ascii=False,
        separators=(",", ":"),
        sort_keys=True,
    )
    size = len(text.encode("utf-8"))
    if size > limit:
        raise PayloadTooLarge(
            f"{field} is {size} bytes, over the {limit}-byte limit (sagas_payload_limit)"
        )
    return text


def decode_json(text: str | bytes) -> Any:
    """Decode JSON text, refusing NaN and Infinity."""

    def refuse(name: str) -> Any:
        raise ValueError(f"non-finite number {name}")

    return json.loads(text, parse_constant=refuse)


def cursor_text(fields: list[Any]) -> str:
    """JSON ``fields`` as an opaque, URL-safe page cursor."""
    return base64.urlsafe_b64encode(json.dumps(fields).encode()).decode().rstrip("=")


def cursor_fields(cursor: object, what: str, *, count: int, max_len: int = 4096) -> list[Any]:
    """The ``count`` fields of a cursor ``cursor_text`` made; SagaValidationError ("malformed
    <what> cursor") for anything else, checked before it is decoded (its length) and after."""
    if isinstance(cursor, str) and len(cursor) <= max_len:
        try:
            padded = cursor + "=" * (-len(cursor) % 4)
            fields = json.loads(base64.urlsafe_b64decode(padded.encode("ascii")))
        except (ValueError, TypeError, UnicodeError, binascii.Error, RecursionError):
            fields = None
        if isinstance(fields, list) and len(fields) == count:
            return fields
    raise SagaValidationError(f"malformed {what} cursor")
