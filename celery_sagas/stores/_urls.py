"""Store URLs: checked before anything is opened, and shown only with their secrets hidden.

``url_problem`` says what is wrong with a store URL (with a hint for the usual near-misses) or
returns None; ``Sagas(...)`` turns its answer into ``SagaConfigurationError`` and
``open_store`` into ``StoreUnavailable``, so a typo fails at configuration, not on first use.
``redact`` hides the password of a URL (user info and query string alike), ``split_cluster``
parses ``redis+cluster://host:port[,host:port...]/``. Standard library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib.util import find_spec
from typing import TypeVar
from urllib.parse import parse_qsl, urlsplit

T = TypeVar("T")

__all__ = ["CLUSTER_SCHEMES", "ClusterUrl", "HiddenUrl", "flag_value", "redact", "redact_text",
           "reveal", "split_cluster", "url_problem"]

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
_REDIS_SCHEMES = {"redis", "rediss", "unix", *CLUSTER_SCHEMES}
_SQL_BASES = {"sqlite", "postgresql", "mysql", "mariadb"}
KNOWN = ("memory://, redis://, rediss://, unix://, redis+cluster://, rediss+cluster://, "
         "sqlite:///, postgresql+psycopg://, mysql+pymysql://")

# Query options redis-py's URL parser and connection classes accept, plus the store's own.
_REDIS_OPTIONS = frozenset({
    "db", "socket_timeout", "socket_connect_timeout", "socket_read_size", "socket_keepalive",
    "retry_on_timeout", "max_connections", "health_check_interval", "ssl_check_hostname",
    "ssl_min_version", "timeout", "protocol", "client_name", "username", "password",
    "ssl_cert_reqs", "ssl_ca_certs", "ssl_ca_path", "ssl_certfile", "ssl_keyfile",
    "ssl_password", "buckets", "require_aof",
})
# Options of the cluster client itself (not of each node's connections).
CLUSTER_OPTIONS = {
    "require_full_coverage": "bool", "dynamic_startup_nodes": "bool",
    "reinitialize_steps": "int", "cluster_error_retry_attempts": "int",
}
_SECRET_KEYS = re.compile(r"(pass|secret|token|key|auth|credential)", re.IGNORECASE)
_HINTS = {
    "postgres": "postgresql+psycopg://user:password@host:5432/db",
    "postgresql": "postgresql+psycopg://user:password@host:5432/db",
    "psql": "postgresql+psycopg://user:password@host:5432/db",
    "mysql": "mysql+pymysql://user:password@host:3306/db",
    "mariadb": "mysql+pymysql://user:password@host:3306/db",
    "redis-cluster": "redis+cluster://host:7000,host:7001/",
    "rediscluster": "redis+cluster://host:7000,host:7001/",
    "redis+tls": "rediss://host:6380/0",
    "sqlite3": "sqlite:///path/to/file.db",
    "mem": "memory://",
}


def redact(url: object, limit: int | None = 200) -> str:
    """The URL with the password of its user info and every secret-looking query value
    replaced by ``***`` (cut to ``limit`` characters)."""
    text = str(url)
    if "://" not in text:
        return text[:80]
    scheme, rest = text.split("://", 1)
    rest, hash_, fragment = rest.partition("#")
    rest, question, query = rest.partition("?")
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        creds, host = authority.rsplit("@", 1)
        user, colon, _ = creds.partition(":")
        authority = f"{user}:***@{host}" if colon else f"{user}@{host}"
    if query:
        query = "&".join(_redact_pair(pair) for pair in query.split("&"))
    shown = f"{scheme}://{authority}{slash}{path}{question}{query}{hash_}{fragment and '***'}"
    return shown[:limit]


_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^:@/\s]*):[^@/\s]*@")
_SECRET_OPTION = re.compile(r"\b([A-Za-z_]*(?:pass|secret|token|key|auth)[A-Za-z_]*)=[^&\s'\"]+",
                            re.IGNORECASE)


def redact_text(text: str) -> str:
    """Free text (a driver's error message) with the password of every URL in it, and every
    ``password=``-like value, replaced by ``***``."""
    return _SECRET_OPTION.sub(r"\1=***", _USERINFO.sub(r"\1:***@", text))


class HiddenUrl(str):
    """A store URL whose text is its redacted form, carrying the real URL for ``reveal``.

    Put in place of ``app.conf.sagas_store`` so that ``celery report``, ``celery inspect conf``
    and any log of the configuration show the URL without its password.
    """

    def __new__(cls, url: str) -> HiddenUrl:
        """Wrap ``url``; the str value is ``redact(url)``."""
        hidden = super().__new__(cls, redact(url, limit=None))
        hidden.__dict__["_url"] = url
        return hidden

    def __reduce__(self) -> tuple[type[HiddenUrl], tuple[str]]:
        return HiddenUrl, (self.__dict__["_url"],)


def reveal(url: T) -> T:
    """The real URL of a ``HiddenUrl``; anything else as it is."""
    if isinstance(url, HiddenUrl):
        real: T = url.__dict__["_url"]
        return real
    return url


def _redact_pair(pair: str) -> str:
    name, equals, value = pair.partition("=")
    return f"{name}=***" if equals and value and _SECRET_KEYS.search(name) else pair


def url_problem(url: object, extra_schemes: frozenset[str] = frozenset()) -> str | None:
    """What is wrong with a store URL, with a hint when a usual form was meant; None if it is
    well formed. ``extra_schemes`` are the schemes of installed store plugins."""
    if not isinstance(url, str):
        return f"a store URL must be a str, got {type(url).__name__}"
    shown = redact(url)
    if "://" not in url:
        scheme = url.split(":", 1)[0].lower() if ":" in url else ""
        if scheme and _known(scheme, extra_schemes):
            return f"store URL {shown!r} lacks '//' after '{scheme}:': write {scheme}://..."
        return f"store URL must look like scheme://..., got {shown!r} (known: {KNOWN})"
    scheme = url.split("://", 1)[0].lower()
    base = scheme.split("+", 1)[0]
    if base == "memory":
        return None
    if scheme in _REDIS_SCHEMES:
        return _redis_problem(url, scheme, shown)
    if base in _SQL_BASES:
        return _sql_problem(scheme, base)
    if scheme in extra_schemes or base in extra_schemes:
        return None
    hint = _HINTS.get(scheme) or _HINTS.get(base)
    if hint:
        return f"no store for scheme {scheme!r}: did you mean {hint}?"
    return f"no store for scheme {scheme!r} in {shown!r} (known: {KNOWN})"


def _known(scheme: str, extra: frozenset[str]) -> bool:
    return scheme in _REDIS_SCHEMES or scheme in _SQL_BASES or scheme == "memory" \
        or scheme in extra


# SQLAlchemy's default driver of a dialect named without "+driver".
_DEFAULT_DRIVERS = {"postgresql": "psycopg2", "mysql": "MySQLdb", "mariadb": "MySQLdb"}


def _sql_problem(scheme: str, base: str) -> str | None:
    default = _DEFAULT_DRIVERS.get(base)
    if "+" not in scheme and default is not None and find_spec(default) is None:
        return (f"store URL scheme {scheme!r} names no installed driver ({default} is SQLAlchemy's "
                f"default): did you mean {_HINTS[base]}?")
    return None


def _redis_problem(url: str, scheme: str, shown: str) -> str | None:
    try:
        parts = urlsplit(url)
        query = parse_qsl(parts.query, keep_blank_values=True)
    except ValueError as exc:
        return f"store URL {shown!r} cannot be parsed: {exc}"
    for name, value in query:
        if name == "cluster":
            return f"store URL {shown!r}: a cluster is opened with redis+cluster://host:port,.../"
        allowed = name in _REDIS_OPTIONS or (scheme in CLUSTER_SCHEMES and name in CLUSTER_OPTIONS)
        if not allowed:
            return f"store URL {shown!r}: unknown option {name!r}"
        if name in ("db", "buckets") and not value.isdigit():
            return f"store URL {shown!r}: {name}= must be a number, got {value[:20]!r}"
        if name == "require_aof" and flag_value(value) is None:
            return f"store URL {shown!r}: require_aof= must be true or false, got {value[:20]!r}"
    if scheme == "unix":
        return None if parts.path else f"store URL {shown!r} names no socket path"
    if scheme in CLUSTER_SCHEMES:
        try:
            split_cluster(url)
        except ValueError as exc:
            return f"store URL {shown!r}: {exc}"
        return None
    try:
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number
    except ValueError:
        return f"store URL {shown!r}: the port must be a number"
    db = parts.path.strip("/")
    if db and not db.isdigit():
        return f"store URL {shown!r}: the database must be a number (/0../15), got {db[:20]!r}"
    return None


@dataclass(frozen=True, slots=True)
class ClusterUrl:
    """A parsed ``redis+cluster://`` URL: nodes, one plain URL for redis-py, cluster options."""

    nodes: tuple[tuple[str, int], ...]
    node_url: str
    options: dict[str, bool | int]


def split_cluster(url: str) -> ClusterUrl:
    """Parse ``redis+cluster://[user:password@]host:port[,host:port...][/0][?options]``;
    ValueError says what is wrong (never quoting the password)."""
    scheme, rest = url.split("://", 1)
    plain = CLUSTER_SCHEMES.get(scheme.lower())
    if plain is None:
        raise ValueError("not a cluster URL")
    rest, _, query = rest.partition("?")
    authority, _, path = rest.partition("/")
    creds, at, hosts = authority.rpartition("@")
    if path not in ("", "0"):
        raise ValueError("a cluster has only database 0: end the URL with / or /0")
    nodes = tuple(_node(item) for item in hosts.split(","))
    options: dict[str, bool | int] = {}
    kept = []
    for name, value in parse_qsl(query, keep_blank_values=True):
        kind = CLUSTER_OPTIONS.get(name)
        if kind is None:
            if name == "db" and value != "0":
                raise ValueError("a cluster has only database 0")
            if name not in ("db", "buckets", "require_aof"):
                kept.append(f"{name}={value}")
            continue
        options[name] = _option(name, value, kind)
    host, port = nodes[0]
    node_url = f"{plain}://{creds}{at}{host}:{port}/" + (f"?{'&'.join(kept)}" if kept else "")
    return ClusterUrl(nodes, node_url, options)


def _node(item: str) -> tuple[str, int]:
    host, colon, port = item.strip().rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"each node must be host:port, got {item[:60]!r}")
    return host.strip("[]"), int(port)


def _option(name: str, value: str, kind: str) -> bool | int:
    if kind == "int":
        if not value.isdigit():
            raise ValueError(f"{name}= must be a number")
        return int(value)
    flag = flag_value(value)
    if flag is None:
        raise ValueError(f"{name}= must be true or false")
    return flag


def flag_value(value: str) -> bool | None:
    """A URL option's true/false (also yes/no, 1/0, any case); None for anything else."""
    lowered = value.lower()
    if lowered in ("true", "yes", "1"):
        return True
    if lowered in ("false", "no", "0"):
        return False
    return None
