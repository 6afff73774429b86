"""The pieces of a configuration: sources, sinks, storage, pipelines and their handles.

Every constructor checks its arguments at once and raises :class:`ConfigError` naming the
field and what is allowed. Objects are immutable and compare by value.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Dict, List, Mapping, NoReturn, Optional, Sequence, Tuple, Union

from ._errors import ConfigError, Segment, field_error

_SIMPLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_ENV_WHOLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}\Z")
_PG_OBJECT_NAME = re.compile(r"[a-z0-9_]{1,63}\Z")
_DURATION = re.compile(r"\s*([0-9]+)\s*(ms|s|m|h|d)\s*\Z")
_DURATION_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_SIZE = re.compile(r"([0-9]+)(.*)\Z", re.DOTALL)
_SIZE_SHIFT = {
    "": 0, "b": 0, "k": 10, "kb": 10, "kib": 10, "m": 20, "mb": 20, "mib": 20,
    "g": 30, "gb": 30, "gib": 30, "t": 40, "tb": 40, "tib": 40,
}
_U64 = 2**64
# Line breaks and other control characters cannot be written on one line of skippr.yml.
_CONTROL = re.compile("[\x00-\x1f\x7f\x85\u2028\u2029]")

SIMPLE_NAME_RULE = "use letters, digits and `_`, starting with a letter or `_`"


def describe(value: object) -> str:
    """A short description of a value's type for error messages."""
    if value is None:
        return "None"
    if isinstance(value, bool):
        return f"a boolean ({value})"
    if isinstance(value, int):
        return f"an integer ({value})"
    if isinstance(value, float):
        return f"a number ({value})"
    if isinstance(value, str):
        return f"a string ({value!r})"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"a {type(value).__name__}"


def is_simple_name(s: str) -> bool:
    """Letters, digits and ``_``, starting with a letter or ``_`` (ASCII)."""
    return _SIMPLE_NAME.match(s) is not None


def has_reference(s: str) -> bool:
    """Whether skipprd rewrites ``s`` when it loads the file (``${VAR}``, ``$$``).

    Such values are only known then, so their format is left for skipprd to check.
    """
    return "$" in s


def duration_ms(text: str) -> Optional[int]:
    """A duration as skipprd reads one (``500ms``, ``30s``, ``2m``, ``1h``), in milliseconds;
    None when it is not one."""
    m = _DURATION.match(text)
    if m is None or int(m.group(1)) >= _U64:
        return None
    ms = int(m.group(1)) * _DURATION_MS[m.group(2)]
    return ms if ms < _U64 else None


def size_bytes(text: str) -> Optional[int]:
    """A size as skipprd reads one (``512MB``, ``10GiB``, ``1048576``; K, M, G and T are
    powers of 1024), in bytes; None when it is not one."""
    m = _SIZE.match(text.strip())
    if m is None or int(m.group(1)) >= _U64:
        return None
    shift = _SIZE_SHIFT.get(m.group(2).strip().lower())
    if shift is None:
        return None
    n = int(m.group(1)) << shift
    return n if n < _U64 else None


def heartbeat_interval_problem(text: str) -> Optional[str]:
    """What is wrong with ``text`` as ``heartbeat_interval``, as skipprd says it, or None."""
    if text.strip() == "0" or duration_ms(text) is not None:
        return None
    return f"`{text}` is not a duration: write e.g. `30s`, `1m` or `0` (no heartbeat)"


def max_retained_wal_problem(text: str) -> Optional[str]:
    """What is wrong with ``text`` as ``max_retained_wal``, as skipprd says it, or None."""
    if (size_bytes(text) or 0) > 0:
        return None
    return f"`{text}` is not a size: write e.g. `10GiB` or `512MB`"


@dataclass(frozen=True)
class EnvRef:
    """A reference to an environment variable, written ``${NAME}``.

    skipprd reads the variable when it loads the file; this package never reads the
    environment, so the value is never written to the file.
    """

    name: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise field_error("EnvRef", ["name"], f"expected a string, found {describe(self.name)}")
        if not is_simple_name(self.name):
            raise field_error(
                "EnvRef",
                ["name"],
                f"`{self.name}` is not a valid environment variable name: {SIMPLE_NAME_RULE}",
            )

    def __str__(self) -> str:
        return "${" + self.name + "}"


#: A string setting: literal text, or a reference to an environment variable.
Text = Union[str, EnvRef]


class _Check:
    """Argument checks for one constructor; errors name ``owner.field``."""

    def __init__(self, owner: str) -> None:
        self.owner = owner

    def fail(self, segments: Sequence[Segment], message: str) -> NoReturn:
        raise field_error(self.owner, segments, message)

    def _string(self, segments: Sequence[Segment], value: str) -> str:
        bad = _CONTROL.search(value)
        if bad:
            self.fail(
                segments,
                f"{value!r} contains the control character {bad.group()!r}; "
                "settings are single-line text",
            )
        return value

    def text(self, field: str, value: object, *, required: bool) -> Optional[Text]:
        """A string or an :class:`EnvRef`; an exact ``${NAME}`` string becomes an EnvRef."""
        if value is None:
            if required:
                self.fail([field], "is required: give a string (or an EnvRef)")
            return None
        if isinstance(value, EnvRef):
            return value
        if not isinstance(value, str):
            self.fail([field], f"expected a string (or an EnvRef), found {describe(value)}")
        self._string([field], value)
        if required and not value.strip():
            self.fail([field], "must not be empty")
        whole = _ENV_WHOLE.match(value)
        if whole:
            return EnvRef(whole.group(1))
        return value

    def string(self, field: str, value: object, *, required: bool) -> Optional[str]:
        if value is None:
            if required:
                self.fail([field], "is required: give a string")
            return None
        if not isinstance(value, str):
            self.fail([field], f"expected a string, found {describe(value)}")
        self._string([field], value)
        if not value.strip():
            self.fail([field], "must not be empty")
        return value

    def duration(self, field: str, value: object, least_ms: int, least: str, examples: str) -> Optional[str]:
        """A duration such as ``500ms``, ``30s``, ``2m`` or ``1h`` of at least ``least_ms``
        (written ``least``); a ``${NAME}`` reference is checked by skipprd once resolved."""
        text = self.string(field, value, required=False)
        if text is not None and not has_reference(text):
            m = _DURATION.match(text)
            if m is None or int(m.group(1)) * _DURATION_MS[m.group(2)] < least_ms:
                self.fail([field], f"`{text}` is not a duration of at least {least}: write e.g. {examples}")
        return text

    def integer(self, field: str, value: object, low: int, high: int, what: str) -> Optional[int]:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail([field], f"expected {what} ({low}-{high}), found {describe(value)}")
        if not low <= value <= high:
            self.fail([field], f"{value} is out of range: {what} must be between {low} and {high}")
        return int(value)

    def flag(self, field: str, value: object) -> Optional[bool]:
        if value is not None and not isinstance(value, bool):
            self.fail([field], f"expected true or false, found {describe(value)}")
        return value

    def text_or_integer(self, field: str, value: object) -> Optional[str]:
        """A string, or a whole number taken as its text (``0``), as skipprd reads it."""
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        return self.string(field, value, required=False)

    def tables(self, field: str, value: object, *, required: bool) -> Optional[Tuple[str, ...]]:
        if value is None:
            if required:
                self.fail([field], "is required: list at least one table, `name` or `schema.name`")
            return None
        if isinstance(value, str):
            self.fail(
                [field],
                f"expected a list of table names, found {describe(value)}; "
                f"give a list, e.g. [{value!r}]",
            )
        if not isinstance(value, (list, tuple)):
            self.fail([field], f"expected a list of table names, found {describe(value)}")
        if not value:
            if required:
                self.fail([field], "list at least one table: `name` (schema public) or `schema.name`")
            return None
        out = []
        seen: Dict[str, str] = {}
        for i, t in enumerate(value):
            if not isinstance(t, str):
                self.fail([field, i], f"expected a table name (a string), found {describe(t)}")
            self._string([field, i], t)
            if not has_reference(t):
                ref = parse_table(t)
                if ref is None:
                    self.fail(
                        [field, i],
                        f"`{t}` is not a table name: write `name` (schema public) or "
                        "`schema.name`, each a letter or `_` followed by letters, digits, `_` or `$`",
                    )
                iceberg = iceberg_name(ref)
                if iceberg in seen:
                    self.fail(
                        [field, i],
                        f"`{t}` is listed twice (or maps to the same Iceberg table name "
                        f"`{iceberg}` as `{seen[iceberg]}`)",
                    )
                seen[iceberg] = t
            out.append(t)
        return tuple(out)


def parse_table(s: str) -> Optional[Tuple[str, str]]:
    """``name`` -> ``("public", name)``; ``schema.name`` -> ``(schema, name)``; else None."""
    parts = s.split(".")
    if len(parts) == 1:
        schema, name = "public", parts[0]
    elif len(parts) == 2:
        schema, name = parts
    else:
        return None
    if not (_is_identifier(schema) and _is_identifier(name)):
        return None
    return schema, name


def iceberg_name(ref: Tuple[str, str]) -> str:
    """The Iceberg table of a source table: its name in ``public``, ``<schema>_<name>``
    elsewhere."""
    return ref[1] if ref[0] == "public" else f"{ref[0]}_{ref[1]}"


_CHANGELOG_NAME = re.compile(r"[a-z_][a-z0-9_]{0,254}\Z")


def changelog_name_problem(name: str) -> Optional[str]:
    """What is wrong with ``name`` as a changelog table's name, as skipprd says it, or None:
    Iceberg catalogs (Glue among them) take lower-case letters, digits and underscores."""
    if not name:
        return (
            "the changelog table needs a name: use lower-case letters, digits and underscores, "
            "e.g. `orders_history`, or write `changelog: true` for `<table>_changelog`"
        )
    if _CHANGELOG_NAME.match(name) is None:
        return (
            f"`{name}` is not a table name every catalog takes: use lower-case letters, digits "
            "and underscores, e.g. `orders_history`"
        )
    return None


def changelog_text_problem(text: str) -> str:
    """skipprd's message for ``changelog: <text>`` in a file: a name is ``{table: <name>}``
    (and ``yes`` or ``on``, booleans to YAML 1.1, are no name)."""
    yes_no = text.strip().lower() in ("yes", "no", "on", "off", "y", "n")
    name = text.strip() if not yes_no and changelog_name_problem(text.strip()) is None else "<name>"
    return (
        f"`{text}` is not `true`, `false` or `{{table: <name>}}`: write `changelog: true` for a "
        f"changelog table named `<table>_changelog`, or `changelog: {{table: {name}}}` to name it"
    )


def _is_identifier(s: str) -> bool:
    if not s or not (s[0].isalpha() or s[0] == "_"):
        return False
    return all(c.isalnum() or c in "_$" for c in s[1:])


class _Value:
    """Immutable, compares by the value of its fields."""

    __slots__ = ()
    _fields: Tuple[str, ...] = ()

    def _key(self) -> Tuple[Any, ...]:
        return tuple(getattr(self, f) for f in self._fields)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, _Value)
        return self._key() == other._key()

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._key()))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable; create a new one")

    def _set(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)

    def __repr__(self) -> str:
        parts = []
        for f in self._fields:
            v = getattr(self, f)
            if v is not None:
                if isinstance(v, tuple):
                    v = list(v)
                parts.append(f"{f}={v!r}")
        return f"{type(self).__name__}({', '.join(parts)})"


class LocalStorage(_Value):
    """Skippr keeps its WAL and state in a local folder: ``skipprd_el_storage_mode: local``.

    ``path`` is that folder (``skipprd_el_storage_path``), relative to ``skippr.yml``;
    without it skipprd uses ``.skippr`` beside the file.
    """

    __slots__ = ("path",)
    _fields = ("path",)
    path: Optional[Text]
    #: The value of ``skipprd_el_storage_mode``.
    mode = "local"

    def __init__(self, path: Optional[Text] = None) -> None:
        value = _Check("LocalStorage").text("path", path, required=False)
        if isinstance(value, str) and not value.strip():
            raise field_error(
                "LocalStorage", ["path"], "must not be empty: give a folder, or None for `.skippr`"
            )
        if isinstance(value, str) and value.startswith("s3://"):
            raise field_error(
                "LocalStorage", ["path"],
                "an s3:// location needs S3Storage (`skipprd_el_storage_mode: s3`); "
                "LocalStorage takes a folder",
            )
        self._set("path", value)


class S3Storage(_Value):
    """Skippr keeps its WAL and state in S3: ``skipprd_el_storage_mode: s3``.

    ``path`` is ``s3://bucket/prefix`` (``skipprd_el_storage_path``). skipprd finds AWS
    credentials, region and endpoint the way the AWS CLI does (environment, ``AWS_PROFILE``
    and the shared files, web identity, instance and task roles).
    """

    __slots__ = ("path",)
    _fields = ("path",)
    path: Text
    #: The value of ``skipprd_el_storage_mode``.
    mode = "s3"

    def __init__(self, path: Text) -> None:
        c = _Check("S3Storage")
        value = c.text("path", path, required=True)
        if isinstance(value, str) and not has_reference(value):
            problem = s3_location_problem(value)
            if problem is not None:
                c.fail(["path"], problem)
        self._set("path", value)


def s3_location_problem(url: str) -> Optional[str]:
    """What is wrong with ``url`` as ``s3://bucket/prefix``, as skipprd reports it, or None."""
    if not url.startswith("s3://"):
        return f"`{url}` is not an S3 location: write it as s3://bucket/prefix"
    bucket, _, prefix = url[len("s3://"):].partition("/")
    ok = (
        3 <= len(bucket) <= 63
        and all(ch.islower() or ch.isdigit() or ch in ".-" for ch in bucket)
        and bucket[0].isalnum() and bucket[-1].isalnum()
    )
    if not ok:
        return (
            f"`{bucket}` in `{url}` is not a valid S3 bucket name: 3-63 lowercase letters, "
            "digits, `.` and `-`, starting and ending with a letter or digit"
        )
    prefix = prefix.strip("/")
    if prefix and any(p in ("", ".", "..") for p in prefix.split("/")):
        return (
            f"`{url}` has an empty, `.` or `..` path segment; write the prefix as s3://{bucket}/a/b"
        )
    return None


class QueryUser(_Value):
    """A user of the Postgres-wire gateway of ``skipprd serve`` (``skippr.query.users``),
    logging in with SCRAM-SHA-256. Give the password as an :class:`EnvRef`. An ``admin`` may
    cancel and terminate every user's sessions (``pg_cancel_backend``,
    ``pg_terminate_backend``); any other user reaches only its own."""

    _fields = ("name", "password", "admin")
    __slots__ = _fields
    name: Text
    password: Text
    admin: bool

    def __init__(self, name: Text, password: Text, admin: bool = False) -> None:
        c = _Check("QueryUser")
        self._set("name", c.text("name", name, required=True))
        self._set("password", c.text("password", password, required=True))
        self._set("admin", bool(c.flag("admin", admin)))


class QueryTls(_Value):
    """TLS of the gateway (``skippr.query.tls``): PEM certificate chain and key, relative to
    ``skippr.yml``. If they do not load, ``skipprd serve`` does not start."""

    _fields = ("cert", "key")
    __slots__ = _fields
    cert: Text
    key: Text

    def __init__(self, cert: Text, key: Text) -> None:
        c = _Check("QueryTls")
        self._set("cert", c.text("cert", cert, required=True))
        self._set("key", c.text("key", key, required=True))


class QuerySettings(_Value):
    """The Postgres-wire gateway of ``skipprd serve`` (``skippr.query``).

    ``listen`` is ``host:port`` (skipprd's default: ``127.0.0.1:5433``). Without ``users``
    only loopback clients may connect. ``statement_timeout`` is the sessions' default
    (``"30s"``, ``"5min"``; skipprd's default ``5min``), ``max_connections`` the most clients
    at once (default 100), ``max_query_memory`` the memory one statement may use
    (``"512MiB"``; default ``1GiB``, or ``max_memory`` when that is less),
    ``target_partitions`` how many parts a statement's scans, joins and aggregates are split
    into (default: twice the cores). ``max_memory`` is the memory all statements together may
    use (``"4GiB"``, at least ``16MiB`` and at least ``max_query_memory``; default: half of
    the machine's memory), ``spill_path`` the folder their sorts, aggregates and joins spill
    to, relative to ``skippr.yml`` (default: ``tmp/spill`` under the storage path), and
    ``max_concurrent_statements`` how many statements run at once (1 to 10000; default:
    twice the cores), the next ones waiting their turn within their ``statement_timeout``.
    With ``log_min_duration`` (``"250ms"``, ``"2s"``; ``"0ms"`` for every one), statements that
    take at least that long are logged when they end (default: none are).
    """

    _fields = ("listen", "users", "tls", "statement_timeout", "max_connections", "max_query_memory",
               "target_partitions", "max_memory", "spill_path", "max_concurrent_statements",
               "log_min_duration")
    __slots__ = _fields
    listen: Optional[Text]
    users: Tuple[QueryUser, ...]
    tls: Optional[QueryTls]
    statement_timeout: Optional[str]
    max_connections: Optional[int]
    max_query_memory: Optional[str]
    target_partitions: Optional[int]
    max_memory: Optional[str]
    spill_path: Optional[Text]
    max_concurrent_statements: Optional[int]
    log_min_duration: Optional[str]

    def __init__(
        self,
        listen: Optional[Text] = None,
        users: Sequence[QueryUser] = (),
        tls: Optional[QueryTls] = None,
        statement_timeout: Optional[str] = None,
        max_connections: Optional[int] = None,
        max_query_memory: Optional[str] = None,
        target_partitions: Optional[int] = None,
        max_memory: Optional[str] = None,
        spill_path: Optional[Text] = None,
        max_concurrent_statements: Optional[int] = None,
        log_min_duration: Optional[str] = None,
    ) -> None:
        c = _Check("QuerySettings")
        self._set("listen", c.text("listen", listen, required=False))
        if isinstance(users, (str, bytes)) or not isinstance(users, (list, tuple)):
            c.fail(["users"], f"expected a list of QueryUser, found {describe(users)}")
        for i, u in enumerate(users):
            if not isinstance(u, QueryUser):
                c.fail(["users", i], f"expected a QueryUser, found {describe(u)}")
        names = [str(u.name) for u in users]
        for n in names:
            if names.count(n) > 1:
                c.fail(["users"], f"user `{n}` is listed twice")
        self._set("users", tuple(users))
        if tls is not None and not isinstance(tls, QueryTls):
            c.fail(["tls"], f"expected a QueryTls, found {describe(tls)}")
        self._set("tls", tls)
        self._set("statement_timeout", c.string("statement_timeout", statement_timeout, required=False))
        self._set(
            "max_connections",
            c.integer("max_connections", max_connections, 1, 100000, "a number of connections"),
        )
        query_memory = c.string("max_query_memory", max_query_memory, required=False)
        query_bytes = None
        if query_memory is not None and not has_reference(query_memory):
            query_bytes = size_bytes(query_memory)
            if query_bytes is None or query_bytes < 1 << 20:
                c.fail(
                    ["max_query_memory"],
                    f"`{query_memory}` is not a size of at least 1MiB: write e.g. `512MiB` or `2GiB`",
                )
        self._set("max_query_memory", query_memory)
        self._set(
            "target_partitions",
            c.integer("target_partitions", target_partitions, 1, 1024, "a number of parts"),
        )
        memory = c.string("max_memory", max_memory, required=False)
        if memory is not None and not has_reference(memory):
            memory_bytes = size_bytes(memory)
            if memory_bytes is None or memory_bytes < 16 << 20:
                c.fail(["max_memory"], f"`{memory}` is not a size of at least 16MiB: write e.g. `4GiB`")
            if query_bytes is not None and memory_bytes < query_bytes:
                c.fail(
                    ["max_memory"],
                    f"`{memory}` is less than skippr.query.max_query_memory, which is what one "
                    "statement may use: raise max_memory or lower max_query_memory",
                )
        self._set("max_memory", memory)
        spill = c.text("spill_path", spill_path, required=False)
        if isinstance(spill, str) and not spill.strip():
            c.fail(["spill_path"], "must not be empty: give a folder, or leave the key out")
        self._set("spill_path", spill)
        statements = max_concurrent_statements
        if statements is not None:
            if isinstance(statements, bool) or not isinstance(statements, int):
                c.fail(
                    ["max_concurrent_statements"],
                    f"expected a number of statements (1-10000), found {describe(statements)}",
                )
            if not 1 <= statements <= 10000:
                c.fail(
                    ["max_concurrent_statements"],
                    f"{statements} is not between 1 and 10000: twice the cores suits most machines",
                )
        self._set("max_concurrent_statements", statements)
        self._set("log_min_duration", c.string("log_min_duration", log_min_duration, required=False))


class MetricsSettings(_Value):
    """The Prometheus endpoint of ``skipprd serve`` (``skippr.metrics``); ``listen`` is
    ``host:port`` (skipprd's default: ``127.0.0.1:9187``)."""

    _fields = ("listen",)
    __slots__ = _fields
    listen: Optional[Text]

    def __init__(self, listen: Optional[Text] = None) -> None:
        self._set("listen", _Check("MetricsSettings").text("listen", listen, required=False))


class LeaseSettings(_Value):
    """Pipeline leases in S3 mode (``skippr.lease``): ``renew_every`` (how often the running
    ``sync`` or ``serve`` renews the lease of each pipeline, default ``30s``) and
    ``expire_after`` (how long after its last renewal a lease expires and another process may
    take the pipeline over, default ``2m``). Each is a duration of at least ``1s``."""

    _fields = ("renew_every", "expire_after")
    __slots__ = _fields
    renew_every: Optional[str]
    expire_after: Optional[str]

    def __init__(self, renew_every: Optional[str] = None, expire_after: Optional[str] = None) -> None:
        for name, value in (("renew_every", renew_every), ("expire_after", expire_after)):
            self._set(name, _Check("LeaseSettings").duration(name, value, 1000, "1s", "`30s` or `2m`"))


class ReconnectSettings(_Value):
    """Retries after transient faults (``skippr.reconnect``): ``max_backoff`` (longest wait
    between tries, default ``30s``), ``give_up_after`` (how long ``sync`` retries before it
    exits with code 75, default ``5m``; ``serve`` never gives up) and ``peer_timeout``
    (silence after which the connection to the source counts as dead, default ``30s``).
    Each is a duration of at least ``1s``."""

    _fields = ("max_backoff", "give_up_after", "peer_timeout")
    __slots__ = _fields
    max_backoff: Optional[str]
    give_up_after: Optional[str]
    peer_timeout: Optional[str]

    def __init__(
        self,
        max_backoff: Optional[str] = None,
        give_up_after: Optional[str] = None,
        peer_timeout: Optional[str] = None,
    ) -> None:
        for name, value in (
            ("max_backoff", max_backoff),
            ("give_up_after", give_up_after),
            ("peer_timeout", peer_timeout),
        ):
            self._set(name, _Check("ReconnectSettings").duration(name, value, 1000, "1s", "`30s` or `5m`"))


class MaintenanceSettings(_Value):
    """Automatic maintenance of a pipeline's Iceberg tables (``pipelines.<p>.maintenance``):
    ``enabled`` (default ``True``), ``check_interval`` (how often each table is checked, a
    duration of at least ``100ms``, default ``1m``), ``snapshot_retention`` (a snapshot is
    expired once replaced longer ago than this, at least ``1s``, default ``1h``),
    ``min_snapshots_to_keep`` (1 to 1000000, default 10), ``orphan_file_age`` (unreferenced
    files older than this are removed, at least ``1s``, default ``1h``) and
    ``compaction_min_files`` (a compaction runs once this many small data or delete files
    gather, 2 to 1000000, default 8)."""

    _fields = (
        "enabled", "check_interval", "snapshot_retention", "min_snapshots_to_keep",
        "orphan_file_age", "compaction_min_files",
    )
    __slots__ = _fields
    enabled: Optional[bool]
    check_interval: Optional[str]
    snapshot_retention: Optional[str]
    min_snapshots_to_keep: Optional[int]
    orphan_file_age: Optional[str]
    compaction_min_files: Optional[int]

    def __init__(
        self,
        enabled: Optional[bool] = None,
        check_interval: Optional[str] = None,
        snapshot_retention: Optional[str] = None,
        min_snapshots_to_keep: Optional[int] = None,
        orphan_file_age: Optional[str] = None,
        compaction_min_files: Optional[int] = None,
    ) -> None:
        c = _Check("MaintenanceSettings")
        if enabled is not None and not isinstance(enabled, bool):
            c.fail(["enabled"], f"expected true or false, found {describe(enabled)}")
        self._set("enabled", enabled)
        for name, value, least_ms, least in (
            ("check_interval", check_interval, 100, "100ms"),
            ("snapshot_retention", snapshot_retention, 1000, "1s"),
            ("orphan_file_age", orphan_file_age, 1000, "1s"),
        ):
            self._set(name, c.duration(name, value, least_ms, least, "`30s`, `10m` or `2h`"))
        self._set(
            "min_snapshots_to_keep",
            c.integer("min_snapshots_to_keep", min_snapshots_to_keep, 1, 1000000, "a number of snapshots"),
        )
        self._set(
            "compaction_min_files",
            c.integer("compaction_min_files", compaction_min_files, 2, 1000000, "a number of files"),
        )


class DataSourcePostgresSourceCdcMode(str, enum.Enum):
    """How the tables of a Postgres source are read (``cdc_mode``)."""

    #: A consistent snapshot, then the change stream from exactly where it ended (default).
    SNAPSHOTTHENCDC = "snapshot_then_cdc"
    #: Only a consistent snapshot, no replication slot.
    SNAPSHOTONLY = "snapshot_only"
    #: Only the change stream, from the slot's current position.
    CDCONLY = "cdc_only"

    def __str__(self) -> str:
        return self.value


_CDC_ALLOWED = ", ".join(m.value for m in DataSourcePostgresSourceCdcMode)


class DataSourcePostgresSourceSslMode(str, enum.Enum):
    """TLS to a Postgres source (``sslmode``), with libpq's names and meaning."""

    #: Plain TCP only.
    DISABLE = "disable"
    #: TLS when the server offers it, plain otherwise; the certificate is not checked (default).
    PREFER = "prefer"
    #: TLS always; the certificate is checked only when ``sslrootcert`` is given.
    REQUIRE = "require"
    #: TLS with a certificate signed by the CA in ``sslrootcert``.
    VERIFYCA = "verify-ca"
    #: As ``verify-ca``, and the certificate must name the host.
    VERIFYFULL = "verify-full"

    def __str__(self) -> str:
        return self.value


_SSL_ALLOWED = ", ".join(m.value for m in DataSourcePostgresSourceSslMode)


class DataSourcePostgres(_Value):
    """A Postgres database, read by snapshot and logical replication (``Postgres:``).

    Strings may be :class:`EnvRef` (or ``"${NAME}"``), which skipprd fills from the
    environment. Settings left as ``None`` are not written, and skipprd uses its defaults.

    ``heartbeat_interval`` is how often a running pipeline writes a heartbeat message to the
    source, so that its slot advances while nothing in this database changes: a duration
    such as ``"30s"`` or ``"5m"``, or ``"0"`` (or ``0``) for none (skipprd's default ``1m``).
    ``max_retained_wal`` is the WAL the slot may hold back on the server before ``status``,
    the metrics and the log warn: a size such as ``"10GiB"`` or ``"512MB"`` (default
    ``10GiB``). ``failover_slot=True`` creates the slot as a failover slot (Postgres 17 and
    later), which standbys that synchronise slots keep, so the pipeline goes on after a
    promotion (default ``False``).
    """

    #: Fields in the order they are written.
    _fields = (
        "host", "port", "user", "password", "database", "sslmode", "sslrootcert", "tables", "cdc_mode",
        "publication", "slot", "append_only", "snapshot_parallelism", "snapshot_chunk_rows",
        "parquet_target_file_size_mb", "heartbeat_interval", "max_retained_wal", "failover_slot",
    )
    __slots__ = _fields
    host: Text
    port: Optional[int]
    user: Text
    password: Optional[Text]
    database: Text
    sslmode: Optional[DataSourcePostgresSourceSslMode]
    #: PEM file of the CA the server's certificate must chain to, relative to ``skippr.yml``.
    sslrootcert: Optional[Text]
    tables: Tuple[str, ...]
    cdc_mode: Optional[DataSourcePostgresSourceCdcMode]
    publication: Optional[Text]
    slot: Optional[Text]
    #: ``None`` when there are none (an empty list is not written).
    append_only: Optional[Tuple[str, ...]]
    snapshot_parallelism: Optional[int]
    snapshot_chunk_rows: Optional[int]
    parquet_target_file_size_mb: Optional[int]
    heartbeat_interval: Optional[str]
    max_retained_wal: Optional[str]
    failover_slot: Optional[bool]

    def __init__(
        self,
        *,
        host: Text,
        user: Text,
        database: Text,
        tables: Sequence[str],
        port: Optional[int] = None,
        password: Optional[Text] = None,
        sslmode: Union[DataSourcePostgresSourceSslMode, str, None] = None,
        sslrootcert: Optional[Text] = None,
        cdc_mode: Union[DataSourcePostgresSourceCdcMode, str, None] = None,
        publication: Optional[Text] = None,
        slot: Optional[Text] = None,
        append_only: Optional[Sequence[str]] = None,
        snapshot_parallelism: Optional[int] = None,
        snapshot_chunk_rows: Optional[int] = None,
        parquet_target_file_size_mb: Optional[int] = None,
        heartbeat_interval: Union[str, int, None] = None,
        max_retained_wal: Union[str, int, None] = None,
        failover_slot: Optional[bool] = None,
    ) -> None:
        c = _Check("DataSourcePostgres")
        self._set("host", c.text("host", host, required=True))
        self._set("port", c.integer("port", port, 1, 65535, "a port number"))
        self._set("user", c.text("user", user, required=True))
        self._set("password", c.text("password", password, required=False))
        self._set("database", c.text("database", database, required=True))
        self._set("sslmode", _ssl_mode(c, sslmode))
        rootcert = c.text("sslrootcert", sslrootcert, required=False)
        if isinstance(rootcert, str) and not rootcert.strip():
            c.fail(["sslrootcert"], "must not be empty: give the path of the CA certificate file (PEM), or leave it out")
        self._set("sslrootcert", rootcert)
        the_tables = c.tables("tables", tables, required=True)
        self._set("tables", the_tables)
        self._set("cdc_mode", _cdc_mode(c, cdc_mode))
        for field, value in (("publication", publication), ("slot", slot)):
            v = c.text(field, value, required=False)
            if isinstance(v, str) and not has_reference(v) and not _PG_OBJECT_NAME.match(v):
                c.fail(
                    [field],
                    f"`{v}` is not a valid {field} name: use at most 63 lower-case letters, digits and `_`",
                )
            self._set(field, v)
        only = c.tables("append_only", append_only, required=False)
        if only is not None and the_tables is not None:
            listed = {parse_table(t) for t in the_tables if not has_reference(t)}
            deferred = any(has_reference(t) for t in the_tables)
            for i, t in enumerate(only):
                if not has_reference(t) and not deferred and parse_table(t) not in listed:
                    c.fail(
                        ["append_only", i],
                        f"`{t}` is not one of the source's tables ({', '.join(the_tables)})",
                    )
        self._set("append_only", only)
        self._set(
            "snapshot_parallelism",
            c.integer("snapshot_parallelism", snapshot_parallelism, 1, 64, "the number of connections"),
        )
        self._set(
            "snapshot_chunk_rows",
            c.integer("snapshot_chunk_rows", snapshot_chunk_rows, 1_000, 100_000_000, "a number of rows"),
        )
        self._set(
            "parquet_target_file_size_mb",
            c.integer(
                "parquet_target_file_size_mb", parquet_target_file_size_mb, 1, 4096, "a size in MiB"
            ),
        )
        for key, given, problem in (
            ("heartbeat_interval", heartbeat_interval, heartbeat_interval_problem),
            ("max_retained_wal", max_retained_wal, max_retained_wal_problem),
        ):
            text = c.text_or_integer(key, given)
            if text is not None and not has_reference(text):
                message = problem(text)
                if message is not None:
                    c.fail([key], message)
            self._set(key, text)
        self._set("failover_slot", c.flag("failover_slot", failover_slot))


def _ssl_mode(c: _Check, value: object) -> Optional[DataSourcePostgresSourceSslMode]:
    if value is None or isinstance(value, DataSourcePostgresSourceSslMode):
        return value
    if isinstance(value, str):
        if has_reference(value):
            return value  # type: ignore[return-value]
        for m in DataSourcePostgresSourceSslMode:
            if m.value == value:
                return m
        c.fail(["sslmode"], f"unknown value `{value}`; allowed: {_SSL_ALLOWED}")
    c.fail(
        ["sslmode"],
        f"expected a DataSourcePostgresSourceSslMode or one of {_SSL_ALLOWED}, found {describe(value)}",
    )


def _cdc_mode(c: _Check, value: object) -> Optional[DataSourcePostgresSourceCdcMode]:
    if value is None or isinstance(value, DataSourcePostgresSourceCdcMode):
        return value
    if isinstance(value, str):
        for m in DataSourcePostgresSourceCdcMode:
            if m.value == value:
                return m
        c.fail(["cdc_mode"], f"unknown value `{value}`; allowed: {_CDC_ALLOWED}")
    c.fail(
        ["cdc_mode"],
        f"expected a DataSourcePostgresSourceCdcMode or one of {_CDC_ALLOWED}, found {describe(value)}",
    )


class DataSinkLocalIceberg(_Value):
    """Iceberg tables in a local warehouse folder with an embedded sqlite catalog
    (``LocalIceberg:``). ``warehouse`` is relative to ``skippr.yml``."""

    __slots__ = ("warehouse",)
    _fields = ("warehouse",)
    warehouse: Text
    #: The connector key in ``skippr.yml``.
    kind = "LocalIceberg"

    def __init__(self, warehouse: Text) -> None:
        self._set("warehouse", _Check("DataSinkLocalIceberg").text("warehouse", warehouse, required=True))


class DataSinkAthenaIceberg(_Value):
    """Iceberg tables on S3, registered in AWS Glue, queried with Athena (``AthenaIceberg:``)."""

    _fields = (
        "warehouse", "glue_database_name", "athena_workgroup_name",
        "athena_results_s3_bucket", "region",
    )
    __slots__ = _fields
    warehouse: Text
    glue_database_name: Text
    athena_workgroup_name: Text
    athena_results_s3_bucket: Text
    region: Text
    #: The connector key in ``skippr.yml``.
    kind = "AthenaIceberg"

    def __init__(
        self,
        *,
        warehouse: Text,
        glue_database_name: Text,
        athena_workgroup_name: Text,
        athena_results_s3_bucket: Text,
        region: Text,
    ) -> None:
        c = _Check("DataSinkAthenaIceberg")
        w = c.text("warehouse", warehouse, required=True)
        if isinstance(w, str) and not w.startswith("s3://") and not has_reference(w):
            c.fail(["warehouse"], f"`{w}` is not an S3 location: write `s3://bucket/prefix/`")
        self._set("warehouse", w)
        self._set("glue_database_name", c.text("glue_database_name", glue_database_name, required=True))
        self._set(
            "athena_workgroup_name", c.text("athena_workgroup_name", athena_workgroup_name, required=True)
        )
        self._set(
            "athena_results_s3_bucket",
            c.text("athena_results_s3_bucket", athena_results_s3_bucket, required=True),
        )
        self._set("region", c.text("region", region, required=True))


#: The SigV4 signing names of AWS's Iceberg REST endpoints.
SIGV4_SERVICES = ("s3tables", "glue")

_URI_EXAMPLE = (
    "write the catalog's base URI as its docs give it, e.g. https://catalog.example.com/api/catalog "
    "(requests go to <uri>/v1/...)"
)


def rest_uri_problem(uri: str) -> Optional[str]:
    """What is wrong with ``uri`` as an Iceberg REST catalog's base URI, as skipprd says it, or None."""
    from urllib.parse import urlsplit

    if not uri.strip():
        return f"must not be empty: {_URI_EXAMPLE}"
    not_url = f"`{uri}` is not an http(s) URL: {_URI_EXAMPLE}"
    try:
        parts = urlsplit(uri.strip())
        host = parts.hostname
        parts.port  # raises ValueError on a port that is not a number
    except ValueError:
        return not_url
    if parts.scheme.lower() not in ("http", "https") or not host:
        return not_url
    if parts.username or parts.password is not None:
        # Not repeated: it holds a secret.
        return (
            "holds a user name or password: give the URI without them, and the secret in "
            "`credential` (OAuth2 client credentials) or `token`"
        )
    if parts.query or parts.fragment or "?" in uri or "#" in uri:
        return f"`{uri}` has a query or fragment: give the catalog's base URI only ({_URI_EXAMPLE})"
    if parts.path.rstrip("/").endswith("/v1"):
        base = uri.strip().rstrip("/")
        base = base[: -len("/v1")] if base.endswith("/v1") else base
        return f"`{uri}` ends with /v1, which the client appends itself: write {base}"
    return None


def credential_problem(credential: str) -> Optional[str]:
    """What is wrong with OAuth2 client credentials, ``<client id>:<client secret>``, or None
    (the value is never repeated)."""
    client_id, colon, secret = credential.partition(":")
    if colon and client_id.strip() and secret.strip():
        return None
    return (
        "is not `<client id>:<client secret>`: write it as ${CLIENT_ID}:${CLIENT_SECRET}, with the "
        "two parts in environment variables"
    )


def sigv4_service_problem(service: str) -> Optional[str]:
    """What is wrong with ``service`` as a SigV4 signing name, or None."""
    if service in SIGV4_SERVICES:
        return None
    return (
        f"`{service}` is not a signing name of an AWS Iceberg REST endpoint; allowed: "
        f"{', '.join(SIGV4_SERVICES)} (`s3tables` for S3 Tables, `glue` for Glue)"
    )


_ARN_FORM = (
    "write it as arn:aws:s3tables:<region>:<account>:bucket/<name>, as the S3 console or "
    "`aws s3tables list-table-buckets` shows it"
)
_TABLE_BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]\Z")


def table_bucket_arn_problem(arn: str, region: str) -> Optional[str]:
    """What is wrong with ``arn`` as the ARN of an S3 table bucket in ``region``, or None."""
    parts = arn.split(":", 5)
    if len(parts) != 6:
        return f"`{arn}` is not a table bucket ARN: {_ARN_FORM}"
    word, partition, service, arn_region, account, resource = parts
    name = resource[len("bucket/"):] if resource.startswith("bucket/") else ""
    ok = (
        word == "arn"
        and partition in ("aws", "aws-cn", "aws-us-gov")
        and service == "s3tables"
        and bool(arn_region)
        and len(account) == 12
        and account.isascii()
        and account.isdigit()
        and _TABLE_BUCKET_NAME.match(name) is not None
    )
    if not ok:
        return f"`{arn}` is not a table bucket ARN: {_ARN_FORM}"
    if region.strip() and arn_region != region.strip():
        return (
            f"the table bucket is in {arn_region}, and `region` says {region.strip()}: give the "
            "bucket's own region"
        )
    return None


class DataSinkRestIcebergSigv4(_Value):
    """AWS SigV4 signing of an Iceberg REST catalog's requests (``sigv4:``), for AWS's
    endpoints: ``service`` is ``"s3tables"`` (S3 Tables) or ``"glue"`` (Glue). skipprd signs
    with the AWS credentials it finds the way the AWS CLI does."""

    _fields = ("region", "service")
    __slots__ = _fields
    region: Text
    service: Text

    def __init__(self, region: Text, service: Text) -> None:
        c = _Check("DataSinkRestIcebergSigv4")
        self._set("region", c.text("region", region, required=True))
        s = c.text("service", service, required=True)
        if isinstance(s, str) and not has_reference(s):
            problem = sigv4_service_problem(s)
            if problem is not None:
                c.fail(["service"], problem)
        self._set("service", s)


#: A property value: text (a boolean or an integer is written as its text).
PropertyValue = Union[str, EnvRef, bool, int]


def _property_text(c: _Check, key: str, value: object) -> Text:
    if isinstance(value, EnvRef):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    if not isinstance(value, str):
        c.fail(
            ["properties", key],
            f"expected a text value (a string, a boolean or a number), found {describe(value)}",
        )
    c._string(["properties", key], value)
    whole = _ENV_WHOLE.match(value)
    return EnvRef(whole.group(1)) if whole else value


class DataSinkRestIceberg(_Value):
    """Iceberg tables behind an Iceberg REST catalog (``RestIceberg:``): Apache Polaris /
    Snowflake Open Catalog, Lakekeeper, Nessie, Unity Catalog, Gravitino, or AWS's S3 Tables
    and Glue endpoints.

    ``uri`` is the catalog's base URI as its docs give it (requests go to ``<uri>/v1/...``);
    ``warehouse`` the warehouse as the catalog names it. The catalog is reached with OAuth2
    client credentials (``credential``, ``"<client id>:<client secret>"``, best as
    ``"${CLIENT_ID}:${CLIENT_SECRET}"``, with ``scope``), a bearer token (``token``), or AWS
    SigV4 (``sigv4``), one at a time, or none. ``properties`` are catalog and storage
    properties (``{"s3.endpoint": "http://127.0.0.1:9000"}``), written in the order given.
    """

    _fields = ("uri", "warehouse", "credential", "token", "scope", "sigv4", "properties")
    __slots__ = _fields
    uri: Text
    warehouse: Optional[Text]
    credential: Optional[Text]
    token: Optional[Text]
    scope: Optional[Text]
    sigv4: Optional[DataSinkRestIcebergSigv4]
    #: Read-only, in the order given; ``None`` when there are none.
    properties: Optional["MappingProxyType[str, Text]"]
    #: The connector key in ``skippr.yml``.
    kind = "RestIceberg"
    #: The keys a file must give.
    required = ("uri",)

    def __init__(
        self,
        *,
        uri: Text,
        warehouse: Optional[Text] = None,
        credential: Optional[Text] = None,
        token: Optional[Text] = None,
        scope: Optional[Text] = None,
        sigv4: Optional[DataSinkRestIcebergSigv4] = None,
        properties: Optional[Mapping[str, PropertyValue]] = None,
    ) -> None:
        c = _Check("DataSinkRestIceberg")
        u = c.text("uri", uri, required=True)
        if isinstance(u, str) and not has_reference(u):
            problem = rest_uri_problem(u)
            if problem is not None:
                c.fail(["uri"], problem)
        self._set("uri", u)
        for field, value, fix in (
            ("warehouse", warehouse, "give the warehouse as the catalog names it (a name or a location), or leave it out for the catalog's default"),
            ("token", token, "give the bearer token (as ${CATALOG_TOKEN}), or leave it out"),
            ("scope", scope, "give the OAuth2 scope (e.g. PRINCIPAL_ROLE:ALL), or leave it out for `catalog`"),
        ):
            v = c.text(field, value, required=False)
            if isinstance(v, str) and not v.strip():
                c.fail([field], f"must not be empty: {fix}")
            self._set(field, v)
        cred = c.text("credential", credential, required=False)
        if isinstance(cred, str) and not has_reference(cred):
            problem = credential_problem(cred)
            if problem is not None:
                c.fail(["credential"], problem)
        self._set("credential", cred)
        if cred is not None and self.token is not None:
            c.fail(
                ["token"],
                "`credential` and `token` exclude each other: give OAuth2 client credentials "
                "(`credential`) or a bearer token (`token`), not both",
            )
        if sigv4 is not None and not isinstance(sigv4, DataSinkRestIcebergSigv4):
            c.fail(["sigv4"], f"expected a DataSinkRestIcebergSigv4(region, service), found {describe(sigv4)}")
        if sigv4 is not None:
            for field in ("credential", "token"):
                if getattr(self, field) is not None:
                    c.fail(
                        [field],
                        f"`sigv4` requests are signed with AWS credentials (found as the AWS CLI finds "
                        f"them), so `{field}` does not apply: remove it, or remove `sigv4` for a catalog "
                        "that takes OAuth2 or a bearer token",
                    )
        self._set("sigv4", sigv4)
        self._set("properties", self._properties(c, properties))

    @staticmethod
    def _properties(c: _Check, value: object) -> Optional["MappingProxyType[str, Text]"]:
        if value is None:
            return None
        if not isinstance(value, Mapping):
            c.fail(["properties"], f"expected a mapping of property name to value, found {describe(value)}")
        out: Dict[str, Text] = {}
        for key, v in value.items():
            if not isinstance(key, str):
                c.fail(["properties"], f"expected property names as strings, found {describe(key)}")
            c._string(["properties", key], key)
            if not key.strip():
                c.fail(["properties", key], "a property needs a name, e.g. s3.endpoint")
            out[key] = _property_text(c, key, v)
        return MappingProxyType(out) if out else None

    def _key(self) -> Tuple[Any, ...]:
        # The properties compare (and hash) as their items, in order.
        return tuple(
            tuple(v.items()) if isinstance(v, MappingProxyType) else v for v in super()._key()
        )

    def __repr__(self) -> str:
        parts = []
        for f in self._fields:
            v = getattr(self, f)
            if v is None:
                continue
            if f in ("credential", "token") and not isinstance(v, EnvRef) and not has_reference(v):
                v = "<redacted>"
            if isinstance(v, MappingProxyType):
                v = dict(v)
            parts.append(f"{f}={v!r}")
        return f"DataSinkRestIceberg({', '.join(parts)})"


class DataSinkS3TablesIceberg(_Value):
    """Iceberg tables in an S3 table bucket, through the S3 Tables Iceberg REST endpoint
    (``S3TablesIceberg:``): a :class:`DataSinkRestIceberg` at
    ``https://s3tables.<region>.amazonaws.com/iceberg`` with the bucket's ARN as warehouse,
    signed with SigV4. ``table_bucket_arn`` is ``arn:aws:s3tables:<region>:<account>:bucket/<name>``."""

    _fields = ("table_bucket_arn", "region")
    __slots__ = _fields
    table_bucket_arn: Text
    region: Text
    #: The connector key in ``skippr.yml``.
    kind = "S3TablesIceberg"

    def __init__(self, *, table_bucket_arn: Text, region: Text) -> None:
        c = _Check("DataSinkS3TablesIceberg")
        arn = c.text("table_bucket_arn", table_bucket_arn, required=True)
        r = c.text("region", region, required=True)
        if isinstance(arn, str) and not has_reference(arn):
            problem = table_bucket_arn_problem(arn, r if isinstance(r, str) and not has_reference(r) else "")
            if problem is not None:
                c.fail(["table_bucket_arn"], problem)
        self._set("table_bucket_arn", arn)
        self._set("region", r)


class DataSinkGlueRestIceberg(_Value):
    """Iceberg tables in a Glue database, through Glue's Iceberg REST endpoint
    (``GlueRestIceberg:``): a :class:`DataSinkRestIceberg` at
    ``https://glue.<region>.amazonaws.com/iceberg``, signed with SigV4, every table in the
    database ``glue_database_name`` (created when missing)."""

    _fields = ("glue_database_name", "region")
    __slots__ = _fields
    glue_database_name: Text
    region: Text
    #: The connector key in ``skippr.yml``.
    kind = "GlueRestIceberg"

    def __init__(self, *, glue_database_name: Text, region: Text) -> None:
        c = _Check("DataSinkGlueRestIceberg")
        self._set("glue_database_name", c.text("glue_database_name", glue_database_name, required=True))
        self._set("region", c.text("region", region, required=True))


#: A sink connector: what a data sink or a schema sink is.
SinkConnector = Union[
    DataSinkLocalIceberg, DataSinkAthenaIceberg, DataSinkRestIceberg, DataSinkS3TablesIceberg,
    DataSinkGlueRestIceberg,
]
SINK_KINDS = (
    DataSinkLocalIceberg, DataSinkAthenaIceberg, DataSinkRestIceberg, DataSinkS3TablesIceberg,
    DataSinkGlueRestIceberg,
)
#: For messages: the sink connector classes, as a list.
SINK_CLASSES_TEXT = (
    "a DataSinkLocalIceberg, DataSinkAthenaIceberg, DataSinkRestIceberg, DataSinkS3TablesIceberg "
    "or DataSinkGlueRestIceberg"
)
#: The connector keys a data or schema sink may have, as skipprd lists them.
SINK_KEYS_TEXT = "LocalIceberg, AthenaIceberg, RestIceberg, S3TablesIceberg, GlueRestIceberg"


@dataclass(frozen=True)
class DataSourceRef:
    """A handle on a data source of a :class:`Config`, as returned by ``cfg.data_source``."""

    name: str

    @property
    def reference(self) -> str:
        """``data_sources.<name>``, as written in ``skippr.yml``."""
        return f"data_sources.{self.name}"

    def __str__(self) -> str:
        return self.reference


@dataclass(frozen=True)
class DataSinkRef:
    """A handle on a data sink of a :class:`Config`, as returned by ``cfg.data_sink``."""

    name: str

    @property
    def reference(self) -> str:
        """``data_sinks.<name>``, as written in ``skippr.yml``."""
        return f"data_sinks.{self.name}"

    def __str__(self) -> str:
        return self.reference


@dataclass(frozen=True)
class SchemaSinkRef:
    """A handle on a schema sink of a :class:`Config`, as returned by ``cfg.schema_sink``."""

    name: str

    @property
    def reference(self) -> str:
        """``schema_sinks.<name>``, as written in ``skippr.yml``."""
        return f"schema_sinks.{self.name}"

    def __str__(self) -> str:
        return self.reference


def reference_name(
    owner: str, field: str, value: object, section: str, handle: type, handle_doc: str
) -> str:
    """The name in a handle, a ``<section>.<name>`` reference, or a bare name."""
    if isinstance(value, handle):
        name = getattr(value, "name")
        assert isinstance(name, str)
        return name
    if isinstance(value, str):
        name = value[len(section) + 1:] if value.startswith(section + ".") else value
        if name and "." not in name and not _CONTROL.search(name):
            return name
        raise field_error(
            owner,
            [field],
            f"`{value}` is not a reference of the form `{section}.<name>` (or a bare name)",
        )
    raise field_error(
        owner,
        [field],
        f"expected {handle_doc} or a `{section}.<name>` reference, found {describe(value)}",
    )


class DataSinkDef(_Value):
    """A data sink entry: its connector and the name of its schema sink, if linked."""

    __slots__ = ("sink", "schema_sink")
    _fields = ("sink", "schema_sink")
    sink: SinkConnector
    #: The linked schema sink's name (written ``schema_sinks.<name>``), if any.
    schema_sink: Optional[str]

    def __init__(self, sink: SinkConnector, schema_sink: Optional[str] = None) -> None:
        self._set("sink", sink)
        self._set("schema_sink", schema_sink)


#: The transforms ``partition_by`` takes, for messages (as skipprd words them).
_TRANSFORMS = "a column name, year(c), month(c), day(c), hour(c), bucket(N, c) or truncate(W, c)"
_TIME_TRANSFORMS = {
    "year": "year", "years": "year", "month": "month", "months": "month", "day": "day",
    "days": "day", "date": "day", "hour": "hour", "hours": "hour", "date_hour": "hour",
    "identity": "identity",
}
_WIDTH = re.compile(r"\+?[0-9]+\Z")


def _layout_column(text: str) -> Optional[str]:
    """A column as ``partition_by`` and ``sort_by`` name it: bare (folded to lower case, as
    Postgres folds it) or in double quotes (kept as written); None when it is neither."""
    t = text.strip()
    if len(t) >= 2 and t.startswith('"') and t.endswith('"'):
        inner = t[1:-1]
        return inner if inner and '"' not in inner else None
    if t and (t[0].isalpha() or t[0] == "_") and all(c.isalnum() or c in "_$" for c in t):
        return t.lower()
    return None


def _width(text: str, what: str, entry: str) -> int:
    t = text.strip()
    if _WIDTH.match(t) and 0 < int(t) < 2**32:
        return int(t)
    raise ValueError(f"`{entry}`: {what} must be a whole number above 0, not `{t}`")


def partition_entry(entry: str) -> Tuple[str, str]:
    """Reads one ``partition_by`` entry as skipprd does: (partition field name, the entry as
    skipprd prints it). Raises ValueError naming what is wrong."""
    e = entry.strip()
    open_at = e.find("(")
    if open_at < 0:
        column = _layout_column(e)
        if column is None:
            raise ValueError(f"`{e}` is not a column name or a transform: use {_TRANSFORMS}")
        return column, column
    if not e.endswith(")"):
        raise ValueError(f"`{e}` is missing its closing parenthesis")
    name = e[:open_at].strip().lower()
    args = e[open_at + 1:-1].split(",")
    if name in _TIME_TRANSFORMS:
        if len(args) != 1:
            raise ValueError(f"`{e}`: {name}() takes one column")
        column = _layout_column(args[0])
        if column is None:
            raise ValueError(f"`{e}`: `{args[0].strip()}` is not a column name")
        transform = _TIME_TRANSFORMS[name]
        if transform == "identity":
            return column, column
        return f"{column}_{transform}", f"{transform}({column})"
    if name in ("bucket", "truncate"):
        if len(args) != 2:
            letter = "N" if name == "bucket" else "W"
            raise ValueError(f"`{e}`: {name}() takes a width and a column, as {name}({letter}, c)")
        column = _layout_column(args[1])
        if column is None:
            raise ValueError(f"`{e}`: `{args[1].strip()}` is not a column name")
        n = _width(args[0], "the number of buckets" if name == "bucket" else "the width", e)
        suffix = "bucket" if name == "bucket" else "trunc"
        return f"{column}_{suffix}", f"{name}({n}, {column})"
    raise ValueError(f"`{e}`: `{name}` is not a transform: use {_TRANSFORMS}")


def sort_entry(entry: str) -> str:
    """Reads one ``sort_by`` entry as skipprd does (``column [asc|desc] [nulls first|last]``)
    and returns its column. Raises ValueError naming what is wrong."""
    e = entry.strip()
    words = e.split()
    if not words:
        raise ValueError("an empty `sort_by` entry: name a column")
    column = _layout_column(words[0])
    if column is None:
        raise ValueError(f"`{e}`: `{words[0]}` is not a column name")
    rest = [w.lower() for w in words[1:]]
    if rest[:1] in (["asc"], ["desc"]):
        rest = rest[1:]
    if rest not in ([], ["nulls", "first"], ["nulls", "last"]):
        raise ValueError(f"`{e}`: a sort entry is `column [asc|desc] [nulls first|last]`")
    return column


def rejoin(items: Sequence[Any]) -> List[Tuple[int, Any]]:
    """The entries of a ``partition_by`` or ``sort_by`` list, each with the index of the item
    it starts at. YAML splits an unquoted entry of a flow list at its commas
    (``[day(created_at), bucket(16, customer_id)]`` reads as three items); items that leave a
    parenthesis open are joined back with the items that close it, as skipprd does."""
    out: List[Tuple[int, Any]] = []
    open_parens = 0
    for i, item in enumerate(items):
        if open_parens > 0 and isinstance(item, str) and out and isinstance(out[-1][1], str):
            out[-1] = (out[-1][0], f"{out[-1][1]}, {item.strip()}")
        else:
            out.append((i, item))
        last = out[-1][1]
        open_parens = last.count("(") - last.count(")") if isinstance(last, str) else 0
    return out


class PipelineTable(_Value):
    """How one table of a pipeline is laid out in files (``pipelines.<p>.tables.<table>``).

    ``partition_by`` lists the table's partitions, coarsest first: a column (its values as
    they are), ``"year(c)"``, ``"month(c)"``, ``"day(c)"``, ``"hour(c)"``, ``"bucket(N, c)"``
    or ``"truncate(W, c)"``; each data file holds the rows of one partition. ``sort_by`` is
    the order of the rows inside each file: ``"column [asc|desc] [nulls first|last]"``.
    ``exclude_columns`` lists columns left out of the Iceberg table: neither copied nor
    streamed (each column once).
    A bare column name is folded to lower case; write ``'"Name"'`` for a mixed-case one.
    ``skipprd discover`` checks the entries against the table's columns.
    ``changelog`` adds a changelog table beside the table, every change of the table as a
    row, appended: ``True`` names it ``<table>_changelog``, a name such as
    ``"orders_history"`` names it (written ``changelog: {table: orders_history}``).
    """

    _fields = ("partition_by", "sort_by", "exclude_columns", "changelog")
    __slots__ = _fields
    #: ``None`` when not given (an empty list is not written).
    partition_by: Optional[Tuple[str, ...]]
    sort_by: Optional[Tuple[str, ...]]
    exclude_columns: Optional[Tuple[str, ...]]
    #: ``True``/``False`` as given, the changelog table's name, or ``None`` when not given.
    changelog: Union[bool, str, None]

    def __init__(
        self,
        partition_by: Optional[Sequence[str]] = None,
        sort_by: Optional[Sequence[str]] = None,
        exclude_columns: Optional[Sequence[str]] = None,
        changelog: Union[bool, str, None] = None,
    ) -> None:
        c = _Check("PipelineTable")
        seen: Dict[str, str] = {}
        parts = self._entries(c, "partition_by", partition_by)
        for i, e in enumerate(parts or ()):
            try:
                field, shown = partition_entry(e)
            except ValueError as err:
                c.fail(["partition_by", i], str(err))
            if field in seen:
                c.fail(["partition_by"], f"`{shown}` is given twice in `partition_by`: give each entry once")
            seen[field] = shown
        self._set("partition_by", parts)
        columns: Dict[str, int] = {}
        sorts = self._entries(c, "sort_by", sort_by)
        for i, e in enumerate(sorts or ()):
            try:
                column = sort_entry(e)
            except ValueError as err:
                c.fail(["sort_by", i], str(err))
            if column in columns:
                c.fail(["sort_by"], f"`{column}` is given twice in `sort_by`: give each entry once")
            columns[column] = i
        self._set("sort_by", sorts)
        excluded = self._entries(c, "exclude_columns", exclude_columns)
        names: List[str] = []
        for i, e in enumerate(excluded or ()):
            name = _layout_column(e)
            if name is None:
                c.fail(
                    ["exclude_columns", i],
                    f"`{e}` is not a column name: write it bare (folded to lower case) or in double quotes",
                )
            if name in names:
                c.fail(["exclude_columns", i], f"`{e}` is given twice: give each column once")
            names.append(name)
        self._set("exclude_columns", excluded)
        if isinstance(changelog, str):
            c._string(["changelog"], changelog)
            changelog = changelog.strip()
            problem = changelog_name_problem(changelog)
            if problem is not None:
                c.fail(["changelog"], problem)
        elif changelog is not None and not isinstance(changelog, bool):
            c.fail(["changelog"], f"expected True, False or the changelog table's name, found {describe(changelog)}")
        self._set("changelog", changelog)

    def changelog_table(self, table: str) -> Optional[str]:
        """The Iceberg name of the changelog table of ``table`` (named as the source's
        ``tables:`` lists it), or None when it has none."""
        if isinstance(self.changelog, str):
            return self.changelog
        ref = parse_table(table)
        if self.changelog is not True or ref is None:
            return None
        return f"{iceberg_name(ref)}_changelog"

    @staticmethod
    def _entries(c: _Check, field: str, value: object) -> Optional[Tuple[str, ...]]:
        if value is None:
            return None
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            c.fail([field], f"expected a list of entries, found {describe(value)}"
                   + (f"; give a list, e.g. [{value!r}]" if isinstance(value, str) else ""))
        out = []
        for i, e in enumerate(value):
            if not isinstance(e, str):
                c.fail([field, i], f"expected an entry (a string), found {describe(e)}")
            c._string([field, i], e)
            out.append(e.strip())
        return tuple(out) if out else None


def _pipeline_tables(value: object) -> Optional["MappingProxyType[str, PipelineTable]"]:
    """``Pipeline(tables=...)``: table name -> :class:`PipelineTable`, in the order given."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise field_error(
            "Pipeline", ["tables"],
            f"expected a mapping of table name to PipelineTable, found {describe(value)}",
        )
    out: Dict[str, PipelineTable] = {}
    seen: Dict[Tuple[str, str], str] = {}
    for name, settings in value.items():
        if not isinstance(name, str):
            raise field_error("Pipeline", ["tables"], f"expected table names as strings, found {describe(name)}")
        ref = parse_table(name)
        if ref is None:
            raise field_error(
                "Pipeline", ["tables", name],
                f"`{name}` is not a table name: write it as the source's `tables:` lists it, "
                "`name` (schema public) or `schema.name`",
            )
        if ref in seen:
            raise field_error(
                "Pipeline", ["tables", name],
                f"`{name}` is the same table as `{seen[ref]}` above: give each table's settings once",
            )
        seen[ref] = name
        if not isinstance(settings, PipelineTable):
            raise field_error(
                "Pipeline", ["tables", name], f"expected a PipelineTable, found {describe(settings)}"
            )
        out[name] = settings
    return MappingProxyType(out) if out else None


def changelog_problem(
    tables: Mapping[str, PipelineTable], source_name: str, source: "DataSourcePostgres"
) -> Optional[Tuple[str, Segment, str]]:
    """The first changelog of a pipeline's ``tables`` that skipprd refuses, as (table,
    the key it is refused at, skipprd's message): one named like a table the pipeline
    already writes, or any, when the source only copies its tables (``snapshot_only``)."""
    written: Dict[str, str] = {}
    if not any(has_reference(t) for t in source.tables):
        for t in source.tables:
            ref = parse_table(t)
            if ref is not None:
                key = ref[1] if ref[0] == "public" else t
                written[iceberg_name(ref)] = f"the Iceberg table of `{key}`"
    for table, settings in tables.items():
        name = settings.changelog_table(table)
        if name is None:
            continue
        if source.cdc_mode is DataSourcePostgresSourceCdcMode.SNAPSHOTONLY:
            return table, "changelog", (
                f"a changelog records the changes replication brings, and data source `{source_name}` has "
                "`cdc_mode: snapshot_only`: set `cdc_mode: snapshot_then_cdc` (or `cdc_only`), or remove `changelog`"
            )
        if name in written:
            named = isinstance(settings.changelog, str)
            fix = "give the changelog table another name" if named else "name it yourself with `changelog: {table: <name>}`"
            return table, "table" if named else "changelog", (
                f"the changelog of `{table}` would be Iceberg table `{name}`, which is already {written[name]}: {fix}"
            )
        written[name] = f"the changelog of `{table}`"
    return None


class ConsistentCuts(_Value):
    """Consistent cuts of a pipeline (``pipelines.<p>.consistent_cuts``): at each ``every``
    (a duration of at least ``1s``, such as ``"10s"``, ``"1h"`` or ``"1d"``; default ``1h``)
    every table of the pipeline is tagged ``skippr-cut-<UTC time>`` at one source LSN;
    ``keep`` cuts are kept (1 to 100000, default 48)."""

    _fields = ("every", "keep")
    __slots__ = _fields
    every: Optional[str]
    keep: Optional[int]

    def __init__(self, every: Optional[str] = None, keep: Optional[int] = None) -> None:
        c = _Check("ConsistentCuts")
        self._set("every", c.duration("every", every, 1000, "1s", "`10s`, `1h` or `1d`"))
        self._set("keep", c.integer("keep", keep, 1, 100000, "a number of cuts"))


class Pipeline(_Value):
    """One data source flowing into one data sink.

    ``data_source`` and ``data_sink`` are handles from ``cfg.data_source`` and
    ``cfg.data_sink`` (or ``"data_sources.<name>"`` / ``"data_sinks.<name>"``).
    ``commit_interval`` is a duration such as ``"500ms"``, ``"10s"`` or ``"1m"`` (at least
    100ms; skipprd's default is 10s). ``transaction_memory_budget_mb`` is the memory one
    source transaction may take while it streams, in MiB (1 to 1048576; skipprd's default is
    256); a larger transaction spills to disk. ``key_index_memory_budget_mb`` is the memory
    the key index of each table may take, in MiB (1 to 1048576; skipprd's default is 256);
    a larger index lives in a file on local disk. ``maintenance`` is a
    :class:`MaintenanceSettings` (skipprd maintains the tables by default).
    ``consistent_cuts`` is a :class:`ConsistentCuts` (none by default). ``tables`` maps
    a table, named as the source lists it (``"orders"``, ``"sales.refunds"``), to its
    :class:`PipelineTable` (partitions and sort order); it is read-only, in the order given.
    """

    __slots__ = (
        "data_source", "data_sink", "commit_interval", "transaction_memory_budget_mb", "key_index_memory_budget_mb",
        "maintenance", "consistent_cuts", "tables",
    )
    _fields = (
        "data_source", "data_sink", "commit_interval", "transaction_memory_budget_mb", "key_index_memory_budget_mb",
        "maintenance", "consistent_cuts", "tables",
    )
    data_source: DataSourceRef
    data_sink: DataSinkRef
    commit_interval: Optional[str]
    transaction_memory_budget_mb: Optional[int]
    key_index_memory_budget_mb: Optional[int]
    maintenance: Optional[MaintenanceSettings]
    consistent_cuts: Optional[ConsistentCuts]
    tables: Optional["MappingProxyType[str, PipelineTable]"]

    def __init__(
        self,
        data_source: Union[DataSourceRef, str],
        data_sink: Union[DataSinkRef, str],
        commit_interval: Optional[str] = None,
        transaction_memory_budget_mb: Optional[int] = None,
        key_index_memory_budget_mb: Optional[int] = None,
        maintenance: Optional[MaintenanceSettings] = None,
        tables: Optional[Mapping[str, PipelineTable]] = None,
        consistent_cuts: Optional[ConsistentCuts] = None,
    ) -> None:
        source = reference_name(
            "Pipeline", "data_source", data_source, "data_sources", DataSourceRef,
            "a data source handle (from cfg.data_source)",
        )
        sink = reference_name(
            "Pipeline", "data_sink", data_sink, "data_sinks", DataSinkRef,
            "a data sink handle (from cfg.data_sink)",
        )
        self._set("data_source", DataSourceRef(source))
        self._set("data_sink", DataSinkRef(sink))
        self._set(
            "commit_interval",
            _Check("Pipeline").duration("commit_interval", commit_interval, 100, "100ms", "`500ms`, `10s` or `1m`"),
        )
        self._set(
            "transaction_memory_budget_mb",
            _Check("Pipeline").integer(
                "transaction_memory_budget_mb", transaction_memory_budget_mb, 1, 1048576, "a size in MiB"
            ),
        )
        self._set(
            "key_index_memory_budget_mb",
            _Check("Pipeline").integer(
                "key_index_memory_budget_mb", key_index_memory_budget_mb, 1, 1048576, "a size in MiB"
            ),
        )
        if maintenance is not None and not isinstance(maintenance, MaintenanceSettings):
            raise field_error(
                "Pipeline", ["maintenance"], f"expected MaintenanceSettings, found {describe(maintenance)}"
            )
        self._set("maintenance", maintenance)
        if consistent_cuts is not None and not isinstance(consistent_cuts, ConsistentCuts):
            raise field_error(
                "Pipeline", ["consistent_cuts"], f"expected ConsistentCuts, found {describe(consistent_cuts)}"
            )
        self._set("consistent_cuts", consistent_cuts)
        self._set("tables", _pipeline_tables(tables))

    def _key(self) -> Tuple[Any, ...]:
        # The tables mapping compares (and hashes) as its items, in order.
        return tuple(
            tuple(v.items()) if isinstance(v, MappingProxyType) else v for v in super()._key()
        )

    def __repr__(self) -> str:
        parts = [f"data_source={self.data_source.reference!r}", f"data_sink={self.data_sink.reference!r}"]
        if self.commit_interval is not None:
            parts.append(f"commit_interval={self.commit_interval!r}")
        if self.transaction_memory_budget_mb is not None:
            parts.append(f"transaction_memory_budget_mb={self.transaction_memory_budget_mb!r}")
        if self.key_index_memory_budget_mb is not None:
            parts.append(f"key_index_memory_budget_mb={self.key_index_memory_budget_mb!r}")
        if self.maintenance is not None:
            parts.append(f"maintenance={self.maintenance!r}")
        if self.consistent_cuts is not None:
            parts.append(f"consistent_cuts={self.consistent_cuts!r}")
        if self.tables is not None:
            parts.append(f"tables={dict(self.tables)!r}")
        return f"Pipeline({', '.join(parts)})"


def check_simple_name(path: str, what: str, name: object) -> str:
    """Pipeline, workspace, source and sink names: ``[A-Za-z_][A-Za-z0-9_]*``."""
    if not isinstance(name, str):
        raise ConfigError(f"expected the {what} name as a string, found {describe(name)}", path)
    if not is_simple_name(name):
        raise ConfigError(f"`{name}` is not a valid {what} name: {SIMPLE_NAME_RULE}", path)
    return name


__all__ = [
    "ConfigError",
    "DataSinkAthenaIceberg",
    "DataSinkDef",
    "DataSinkGlueRestIceberg",
    "DataSinkLocalIceberg",
    "DataSinkRestIceberg",
    "DataSinkRestIcebergSigv4",
    "DataSinkS3TablesIceberg",
    "DataSinkRef",
    "DataSourcePostgres",
    "DataSourcePostgresSourceCdcMode",
    "DataSourcePostgresSourceSslMode",
    "DataSourceRef",
    "EnvRef",
    "LocalStorage",
    "S3Storage",
    "Pipeline",
    "PipelineTable",
    "SchemaSinkRef",
    "SinkConnector",
    "Text",
]
