"""``Config``: builds, reads and writes a whole ``skippr.yml``."""

from __future__ import annotations

import enum
import os
import tempfile
from types import MappingProxyType
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Type, Union

from ._errors import ConfigError, Segment, display_path
from ._model import (
    SINK_CLASSES_TEXT,
    SINK_KEYS_TEXT,
    SINK_KINDS,
    DataSinkAthenaIceberg,
    DataSinkDef,
    DataSinkGlueRestIceberg,
    DataSinkLocalIceberg,
    DataSinkRestIceberg,
    DataSinkRestIcebergSigv4,
    DataSinkS3TablesIceberg,
    DataSinkRef,
    DataSourcePostgres,
    DataSourceRef,
    LocalStorage,
    S3Storage,
    MetricsSettings,
    LeaseSettings,
    ConsistentCuts,
    MaintenanceSettings,
    ReconnectSettings,
    Pipeline,
    PipelineTable,
    QuerySettings,
    QueryTls,
    QueryUser,
    SchemaSinkRef,
    SinkConnector,
    Text,
    changelog_problem,
    changelog_text_problem,
    check_simple_name,
    describe,
    has_reference,
    is_simple_name,
    parse_table,
    reference_name,
    rejoin,
)
from ._yaml import Document, Node, Scalar, parse, render

PathLike = Union[str, "os.PathLike[str]"]

_SECTIONS = ("skippr", "pipelines", "data_sources", "data_sinks", "schema_sinks")
_SINK_CLASSES: Dict[str, Type[Any]] = {
    "LocalIceberg": DataSinkLocalIceberg,
    "AthenaIceberg": DataSinkAthenaIceberg,
    "RestIceberg": DataSinkRestIceberg,
    "S3TablesIceberg": DataSinkS3TablesIceberg,
    "GlueRestIceberg": DataSinkGlueRestIceberg,
}


def _defined(section: str, names: Sequence[str]) -> str:
    if not names:
        return f"no `{section}` are defined"
    return "defined: " + ", ".join(f"{section}.{n}" for n in names)


class Config:
    """A whole ``skippr.yml``.

    Build it step by step (each step checks its arguments and raises :class:`ConfigError`)::

        cfg = Config().workspace("analytics").storage(LocalStorage())
        src = cfg.data_source("app_db", DataSourcePostgres(...))
        lake = cfg.data_sink("lake", DataSinkLocalIceberg(warehouse="./warehouse"))
        cfg.pipeline("orders", Pipeline(data_source=src, data_sink=lake))
        cfg.save("skippr.yml")

    or read one with :meth:`Config.load`. :meth:`save` writes the same bytes as
    ``skipprd connect`` would for the same settings. Entries keep the order they were added
    (or read) in.
    """

    def __init__(self) -> None:
        self._workspace: Optional[str] = None
        self._storage: Union[LocalStorage, S3Storage] = LocalStorage()
        self._query: Optional[QuerySettings] = None
        self._metrics: Optional[MetricsSettings] = None
        self._reconnect: Optional[ReconnectSettings] = None
        self._lease: Optional[LeaseSettings] = None
        self._pipelines: Dict[str, Pipeline] = {}
        self._data_sources: Dict[str, DataSourcePostgres] = {}
        self._data_sinks: Dict[str, DataSinkDef] = {}
        self._schema_sinks: Dict[str, SinkConnector] = {}

    # ---- building ---------------------------------------------------------------------------

    def workspace(self, name: str) -> Config:
        """Sets the workspace: the Iceberg namespace and SQL schema the tables appear under."""
        if isinstance(name, str) and has_reference(name):
            self._workspace = name
        else:
            self._workspace = check_simple_name("skippr.workspace", "workspace", name)
        return self

    def storage(self, storage: Union[LocalStorage, S3Storage]) -> Config:
        """Sets where skipprd keeps its WAL and state."""
        if not isinstance(storage, (LocalStorage, S3Storage)):
            raise ConfigError(
                f"expected LocalStorage(path=None) or S3Storage(path='s3://bucket/prefix'), found {describe(storage)}",
                "skippr.storage",
            )
        self._storage = storage
        return self

    def query(self, settings: QuerySettings) -> Config:
        """Sets the Postgres-wire gateway of ``skipprd serve`` (``skippr.query``)."""
        if not isinstance(settings, QuerySettings):
            raise ConfigError(
                f"expected QuerySettings(listen, users, tls), found {describe(settings)}",
                "skippr.query",
            )
        self._query = settings
        return self

    def metrics(self, settings: MetricsSettings) -> Config:
        """Sets the Prometheus endpoint of ``skipprd serve`` (``skippr.metrics``)."""
        if not isinstance(settings, MetricsSettings):
            raise ConfigError(
                f"expected MetricsSettings(listen), found {describe(settings)}", "skippr.metrics"
            )
        self._metrics = settings
        return self

    def lease(self, settings: LeaseSettings) -> Config:
        """Sets the pipeline leases of S3 mode (``skippr.lease``)."""
        if not isinstance(settings, LeaseSettings):
            raise ConfigError(
                "expected LeaseSettings(renew_every, expire_after), "
                f"found {describe(settings)}",
                "skippr.lease",
            )
        self._lease = settings
        return self

    def get_lease(self) -> Optional[LeaseSettings]:
        """``skippr.lease``, if set."""
        return self._lease

    def reconnect(self, settings: ReconnectSettings) -> Config:
        """Sets the retries after transient faults (``skippr.reconnect``)."""
        if not isinstance(settings, ReconnectSettings):
            raise ConfigError(
                "expected ReconnectSettings(max_backoff, give_up_after, peer_timeout), "
                f"found {describe(settings)}",
                "skippr.reconnect",
            )
        self._reconnect = settings
        return self

    def data_source(self, name: str, source: DataSourcePostgres) -> DataSourceRef:
        """Adds the data source ``name`` (``data_sources.<name>``) and returns its handle.

        Adding the same name again with the same settings returns the same handle; with
        other settings it is an error.
        """
        name = check_simple_name("data_sources", "data source", name)
        if not isinstance(source, DataSourcePostgres):
            raise ConfigError(
                f"expected a DataSourcePostgres, found {describe(source)}", f"data_sources.{name}"
            )
        self._define(self._data_sources, "data_sources", name, source)
        return DataSourceRef(name)

    def data_sink(
        self,
        name: str,
        sink: SinkConnector,
        schema_sink: Union[str, SchemaSinkRef, None] = None,
    ) -> DataSinkRef:
        """Adds the data sink ``name`` (``data_sinks.<name>``) and returns its handle.

        ``schema_sink`` links a schema sink: an existing one, or, when no schema sink of that
        name exists yet, a new one with the data sink's settings (as
        ``skipprd connect schema-sink KIND --pipeline P --name NAME`` does).
        """
        name = check_simple_name("data_sinks", "data sink", name)
        if not isinstance(sink, SINK_KINDS):
            raise ConfigError(
                f"expected {SINK_CLASSES_TEXT}, found {describe(sink)}",
                f"data_sinks.{name}",
            )
        link: Optional[str] = None
        if schema_sink is not None:
            try:
                link = reference_name(
                    "data_sinks", "schema_sink", schema_sink, "schema_sinks", SchemaSinkRef,
                    "a schema sink name or handle",
                )
            except ConfigError as e:
                raise ConfigError(e.message, f"data_sinks.{name}.schema_sink") from None
            check_simple_name(f"data_sinks.{name}.schema_sink", "schema sink", link)
        existing = self._data_sinks.get(name)
        if existing is not None and link is None:
            link = existing.schema_sink  # keep a link made before, like `skipprd connect`
        definition = DataSinkDef(sink, link)
        self._check_new(self._data_sinks, "data_sinks", name, definition)
        if existing is not None and existing.schema_sink not in (None, link):
            raise ConfigError(
                f"already linked to schema_sinks.{existing.schema_sink}; "
                "choose another data sink name to link another schema sink",
                f"data_sinks.{name}.schema_sink",
            )
        if link is not None and link not in self._schema_sinks:
            self._schema_sinks[link] = sink
        self._data_sinks[name] = definition
        return DataSinkRef(name)

    def schema_sink(self, name: str, sink: SinkConnector) -> SchemaSinkRef:
        """Adds the schema sink ``name`` (``schema_sinks.<name>``): where table schemas are
        registered. Link it with ``cfg.data_sink(..., schema_sink=handle)``."""
        name = check_simple_name("schema_sinks", "schema sink", name)
        if not isinstance(sink, SINK_KINDS):
            raise ConfigError(
                f"expected {SINK_CLASSES_TEXT}, found {describe(sink)}",
                f"schema_sinks.{name}",
            )
        self._define(self._schema_sinks, "schema_sinks", name, sink)
        return SchemaSinkRef(name)

    def pipeline(self, name: str, pipeline: Pipeline) -> Config:
        """Adds the pipeline ``name``; its source and sink must already be in this config."""
        name = check_simple_name("pipelines", "pipeline", name)
        if not isinstance(pipeline, Pipeline):
            raise ConfigError(
                f"expected a Pipeline(data_source=..., data_sink=...), found {describe(pipeline)}",
                f"pipelines.{name}",
            )
        self._check_refs(name, pipeline)
        self._define(self._pipelines, "pipelines", name, pipeline)
        return self

    def _check_refs(self, name: str, pipeline: Pipeline) -> None:
        if pipeline.data_source.name not in self._data_sources:
            raise ConfigError(
                f"`{pipeline.data_source.reference}` refers to nothing; "
                f"{_defined('data_sources', list(self._data_sources))}; add it with cfg.data_source first",
                f"pipelines.{name}.data_source",
            )
        if pipeline.data_sink.name not in self._data_sinks:
            raise ConfigError(
                f"`{pipeline.data_sink.reference}` refers to nothing; "
                f"{_defined('data_sinks', list(self._data_sinks))}; add it with cfg.data_sink first",
                f"pipelines.{name}.data_sink",
            )
        unlisted = self._unlisted_table(pipeline)
        if unlisted is not None:
            raise ConfigError(unlisted[1], f"pipelines.{name}.tables.{unlisted[0]}")
        changelog = self._changelog_problem(pipeline)
        if changelog is not None:
            table, last, message = changelog
            at = "changelog.table" if last == "table" else "changelog"
            raise ConfigError(message, f"pipelines.{name}.tables.{table}.{at}")

    def _changelog_problem(self, pipeline: Pipeline) -> Optional[Tuple[str, Segment, str]]:
        source = self._data_sources.get(pipeline.data_source.name)
        if source is None or pipeline.tables is None:
            return None
        return changelog_problem(pipeline.tables, pipeline.data_source.name, source)

    def _unlisted_table(self, pipeline: Pipeline) -> Optional[Tuple[str, str]]:
        """The first table of ``pipeline.tables`` its data source does not follow, and the
        message saying so (None when every one is listed, or the list is only known once
        skipprd fills a ``${VAR}`` in it)."""
        source = self._data_sources.get(pipeline.data_source.name)
        if source is None or pipeline.tables is None:
            return None
        if any(has_reference(t) for t in source.tables):
            return None
        listed = {parse_table(t) for t in source.tables}
        for table in pipeline.tables:
            if parse_table(table) not in listed:
                name = pipeline.data_source.name
                return table, (
                    f"`{table}` is not one of the tables data source `{name}` follows "
                    f"({', '.join(source.tables)}): add it to data_sources.{name}.Postgres.tables, "
                    "or correct the name here"
                )
        return None

    @staticmethod
    def _check_new(table: Mapping[str, Any], section: str, name: str, value: Any) -> None:
        if name in table and table[name] != value:
            raise ConfigError(
                f"already defined with other settings ({table[name]!r}); "
                "choose another name, or pass the same settings",
                f"{section}.{name}",
            )

    def _define(self, table: Dict[str, Any], section: str, name: str, value: Any) -> None:
        self._check_new(table, section, name, value)
        table[name] = value

    # ---- reading the settings ---------------------------------------------------------------

    def get_workspace(self) -> Optional[str]:
        """The workspace, or None when not set yet."""
        return self._workspace

    def get_storage(self) -> Union[LocalStorage, S3Storage]:
        """Where skipprd keeps its WAL and state (``LocalStorage()`` unless set)."""
        return self._storage

    def get_query(self) -> Optional[QuerySettings]:
        """The gateway settings, or None (skipprd's defaults)."""
        return self._query

    def get_metrics(self) -> Optional[MetricsSettings]:
        """The metrics endpoint settings, or None (skipprd's defaults)."""
        return self._metrics

    def get_reconnect(self) -> Optional[ReconnectSettings]:
        """The retry settings, or None (skipprd's defaults)."""
        return self._reconnect

    @property
    def pipelines(self) -> Mapping[str, Pipeline]:
        """Pipelines by name, read-only."""
        return MappingProxyType(self._pipelines)

    @property
    def data_sources(self) -> Mapping[str, DataSourcePostgres]:
        """Data sources by name, read-only."""
        return MappingProxyType(self._data_sources)

    @property
    def data_sinks(self) -> Mapping[str, DataSinkDef]:
        """Data sinks by name (connector and schema sink link), read-only."""
        return MappingProxyType(self._data_sinks)

    @property
    def schema_sinks(self) -> Mapping[str, SinkConnector]:
        """Schema sinks by name, read-only."""
        return MappingProxyType(self._schema_sinks)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Config):
            return NotImplemented
        return self._state() == other._state()

    __hash__ = None  # type: ignore[assignment]

    def _state(self) -> Tuple[Any, ...]:
        return (
            self._workspace, self._storage, self._query, self._metrics, self._reconnect,
            self._lease, self._pipelines,
            self._data_sources, self._data_sinks, self._schema_sinks,
        )

    def __repr__(self) -> str:
        return (
            f"Config(workspace={self._workspace!r}, storage={self._storage!r}, "
            f"pipelines={self._pipelines!r}, data_sources={self._data_sources!r}, "
            f"data_sinks={self._data_sinks!r}, schema_sinks={self._schema_sinks!r})"
        )

    # ---- writing ----------------------------------------------------------------------------

    def to_yaml(self) -> str:
        """The canonical text of ``skippr.yml``, byte for byte what :meth:`save` writes."""
        if self._workspace is None:
            raise ConfigError(
                "is not set: call .workspace(NAME) before writing the file", "skippr.workspace"
            )
        skippr: Dict[str, Node] = {
            "workspace": self._workspace,
            "skipprd_el_storage_mode": self._storage.mode,
        }
        if self._storage.path is not None:
            skippr["skipprd_el_storage_path"] = self._storage.path
        if self._query is not None:
            query: Dict[str, Node] = {}
            if self._query.listen is not None:
                query["listen"] = self._query.listen
            if self._query.users:
                users: List[Dict[str, Node]] = [
                    {"name": u.name, "password": u.password, **({"admin": True} if u.admin else {})}
                    for u in self._query.users
                ]
                query["users"] = users
            if self._query.tls is not None:
                query["tls"] = {"cert": self._query.tls.cert, "key": self._query.tls.key}
            if self._query.statement_timeout is not None:
                query["statement_timeout"] = self._query.statement_timeout
            if self._query.max_connections is not None:
                query["max_connections"] = self._query.max_connections
            if self._query.max_query_memory is not None:
                query["max_query_memory"] = self._query.max_query_memory
            for key in ("target_partitions", "max_memory", "spill_path", "max_concurrent_statements",
                        "log_min_duration"):
                value = getattr(self._query, key)
                if value is not None:
                    query[key] = value
            skippr["query"] = query
        if self._metrics is not None:
            metrics: Dict[str, Node] = {}
            if self._metrics.listen is not None:
                metrics["listen"] = self._metrics.listen
            skippr["metrics"] = metrics
        if self._reconnect is not None:
            reconnect: Dict[str, Node] = {}
            for key in ReconnectSettings._fields:
                value = getattr(self._reconnect, key)
                if value is not None:
                    reconnect[key] = value
            skippr["reconnect"] = reconnect
        if self._lease is not None:
            lease: Dict[str, Node] = {}
            for key in LeaseSettings._fields:
                value = getattr(self._lease, key)
                if value is not None:
                    lease[key] = value
            skippr["lease"] = lease
        pipelines: Dict[str, Node] = {}
        for name, p in self._pipelines.items():
            entry: Dict[str, Node] = {
                "data_source": p.data_source.reference,
                "data_sink": p.data_sink.reference,
            }
            if p.commit_interval is not None:
                entry["commit_interval"] = p.commit_interval
            if p.transaction_memory_budget_mb is not None:
                entry["transaction_memory_budget_mb"] = p.transaction_memory_budget_mb
            if p.key_index_memory_budget_mb is not None:
                entry["key_index_memory_budget_mb"] = p.key_index_memory_budget_mb
            if p.maintenance is not None:
                maintenance = _fields(p.maintenance, MaintenanceSettings._fields)
                if maintenance:
                    entry["maintenance"] = maintenance
            if p.consistent_cuts is not None:
                entry["consistent_cuts"] = _fields(p.consistent_cuts, ConsistentCuts._fields)
            if p.tables is not None:
                entry["tables"] = {t: _table_fields(s) for t, s in p.tables.items()}
            pipelines[name] = entry
        sources: Dict[str, Node] = {
            name: {"Postgres": _fields(src, src._fields)} for name, src in self._data_sources.items()
        }
        sinks: Dict[str, Node] = {}
        for name, d in self._data_sinks.items():
            sink: Dict[str, Node] = {d.sink.kind: _fields(d.sink, d.sink._fields)}
            if d.schema_sink is not None:
                sink["schema_sink"] = f"schema_sinks.{d.schema_sink}"
            sinks[name] = sink
        schema_sinks: Dict[str, Node] = {
            name: {s.kind: _fields(s, s._fields)} for name, s in self._schema_sinks.items()
        }
        return render(
            {
                "skippr": skippr,
                "pipelines": pipelines,
                "data_sources": sources,
                "data_sinks": sinks,
                "schema_sinks": schema_sinks,
            }
        )

    def save(self, path: PathLike) -> None:
        """Writes the file (replacing it in one step: readers never see half a file)."""
        text = self.to_yaml().encode("utf-8")
        target = os.fspath(path)
        folder = os.path.dirname(os.path.abspath(target))
        fd, tmp = tempfile.mkstemp(prefix=".skippr-", suffix=".yml.tmp", dir=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(text)
            if os.path.exists(target):
                os.chmod(tmp, os.stat(target).st_mode & 0o7777)
            else:
                umask = os.umask(0)
                os.umask(umask)
                os.chmod(tmp, 0o666 & ~umask)
            os.replace(tmp, target)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    # ---- reading ----------------------------------------------------------------------------

    @classmethod
    def load(cls, path: PathLike) -> Config:
        """Reads ``skippr.yml`` (any valid one: block or flow style, any key order).

        ``${VAR}`` references stay literal (an exact ``${VAR}`` becomes an :class:`EnvRef`);
        the environment is never read. A file skipprd would refuse raises
        :class:`ConfigError` naming the file, the line and the field.
        """
        name = os.fspath(path)
        try:
            with open(name, "rb") as f:
                data = f.read()
        except OSError as e:
            raise ConfigError(
                f"cannot read the config file: {e.strerror or e}", file=name
            ) from None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(f"is not UTF-8 text ({e.reason} at byte {e.start})", file=name) from None
        return cls.from_yaml(text, source=name)

    @classmethod
    def from_yaml(cls, text: str, source: str = "<string>") -> Config:
        """Like :meth:`load`, from text; ``source`` names it in errors."""
        return _Reader(parse(text, source)).read(cls())


def _fields(obj: Any, names: Sequence[str]) -> Dict[str, Node]:
    """The set fields of ``obj``, in the order they are written (a nested settings object,
    such as ``sigv4``, and a mapping, such as ``properties``, as block mappings)."""
    out: Dict[str, Node] = {}
    for n in names:
        v = getattr(obj, n)
        if v is None:
            continue
        if isinstance(v, tuple):
            items: List[Scalar] = list(v)
            out[n] = items
        elif isinstance(v, enum.Enum):
            out[n] = str(v.value)
        elif isinstance(v, DataSinkRestIcebergSigv4):
            out[n] = _fields(v, v._fields)
        elif isinstance(v, MappingProxyType):
            inner: Dict[str, Node] = {k: x for k, x in v.items()}
            out[n] = inner
        else:
            out[n] = v
    return out


def _table_fields(table: PipelineTable) -> Dict[str, Node]:
    """A table's settings as written: a changelog name as ``{table: <name>}``."""
    out = _fields(table, PipelineTable._fields)
    if isinstance(table.changelog, str):
        out["changelog"] = {"table": table.changelog}
    return out


_POSTGRES_KEYS = DataSourcePostgres._fields
_POSTGRES_REQUIRED = ("host", "user", "database", "tables")


class _Reader:
    """Turns a parsed document into a Config, checking it as skipprd would."""

    def __init__(self, doc: Document) -> None:
        self.doc = doc

    def fail(self, path: Tuple[Segment, ...], message: str) -> ConfigError:
        return self.doc.error(path, message)

    def mapping(self, path: Tuple[Segment, ...], value: Any, what: str) -> Dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(path, f"wrong type: found {describe(value)}, expected {what}")
        return value

    def keys(
        self,
        path: Tuple[Segment, ...],
        value: Dict[str, Any],
        allowed: Sequence[str],
        required: Sequence[str] = (),
    ) -> None:
        for k in value:
            if k not in allowed:
                raise self.fail(path + (k,), f"unknown key `{k}`; allowed: {', '.join(allowed)}")
        for k in required:
            if k not in value:
                raise self.fail(path, f"missing required key `{k}`")

    def build(self, path: Tuple[Segment, ...], make: Any, kwargs: Dict[str, Any], rename: Optional[Dict[str, str]] = None) -> Any:
        """Calls a constructor, moving its errors to the file's path and line."""
        try:
            return make(**kwargs)
        except ConfigError as e:
            if not e.owner:
                raise
            segs = list(e.segments)
            if rename and segs and isinstance(segs[0], str):
                segs[0] = rename.get(segs[0], segs[0])
            raise self.fail(path + tuple(segs), e.message) from None

    def reference(
        self, path: Tuple[Segment, ...], value: Any, section: str, defined: Sequence[str]
    ) -> str:
        if not isinstance(value, str):
            raise self.fail(path, f"wrong type: found {describe(value)}, expected a reference `{section}.<name>`")
        prefix, dot, name = value.partition(".")
        if prefix != section or not dot:
            raise self.fail(
                path,
                f"`{value}` is not a reference of the form `{section}.<name>`; {_defined(section, defined)}",
            )
        if name not in defined:
            raise self.fail(path, f"`{value}` refers to nothing; {_defined(section, defined)}")
        return name

    def connector(self, path: Tuple[Segment, ...], value: Dict[str, Any], what: str) -> SinkConnector:
        kinds = [k for k in value if k in _SINK_CLASSES]
        if len(kinds) != 1:
            raise self.fail(path, f"{what} needs exactly one connector key; allowed: {SINK_KEYS_TEXT}")
        kind = kinds[0]
        at = path + (kind,)
        fields = self.mapping(at, value[kind], f"the {kind} settings (a mapping)")
        cls = _SINK_CLASSES[kind]
        self.keys(at, fields, cls._fields, getattr(cls, "required", cls._fields))
        fields = dict(fields)
        if cls is DataSinkRestIceberg:
            if fields.get("sigv4") is not None:
                sig = self.mapping(at + ("sigv4",), fields["sigv4"], "a mapping (region, service)")
                names = DataSinkRestIcebergSigv4._fields
                self.keys(at + ("sigv4",), sig, names, names)
                fields["sigv4"] = self.build(at + ("sigv4",), DataSinkRestIcebergSigv4, dict(sig))
            if fields.get("properties") is not None:
                props = self.mapping(at + ("properties",), fields["properties"], "a mapping of property name to value")
                for k, v in props.items():
                    if v is None or isinstance(v, (list, dict)):
                        raise self.fail(
                            at + ("properties", k),
                            f"wrong type: found {describe(v)}, expected a text value (a string, a boolean or a number)",
                        )
                fields["properties"] = props
        sink: SinkConnector = self.build(at, cls, fields)
        return sink

    def read(self, cfg: Config) -> Config:
        doc = self.doc.value
        if doc is None:
            raise self.fail((), "the file is empty; it needs at least a `skippr:` section with a `workspace`")
        top = self.mapping((), doc, "a mapping with a `skippr:` section")
        self.keys((), top, _SECTIONS, ("skippr",))

        # skippr
        settings = self.mapping(("skippr",), top["skippr"], "a mapping")
        self.keys(
            ("skippr",), settings,
            (
                "workspace", "skipprd_el_storage_mode", "skipprd_el_storage_path", "query",
                "metrics", "reconnect", "lease",
            ),
            ("workspace",),
        )
        try:
            cfg.workspace(settings["workspace"])
        except ConfigError as e:
            raise self.fail(("skippr", "workspace"), e.message) from None
        mode = settings.get("skipprd_el_storage_mode")
        if mode is not None and mode not in ("local", "s3"):
            raise self.fail(
                ("skippr", "skipprd_el_storage_mode"),
                f"unknown value `{mode}`; allowed: local, s3",
            )
        path = settings.get("skipprd_el_storage_path")
        if mode == "s3" and path is None:
            raise self.fail(
                ("skippr",),
                "skipprd_el_storage_path is required with `skipprd_el_storage_mode: s3`: "
                "write s3://bucket/prefix",
            )
        cfg.storage(
            self.build(
                ("skippr",), S3Storage if mode == "s3" else LocalStorage, {"path": path},
                {"path": "skipprd_el_storage_path"},
            )
        )

        if "query" in settings:
            at_q: Tuple[Segment, ...] = ("skippr", "query")
            q = self.mapping(at_q, settings["query"], "a mapping (listen, users, tls, ...)")
            self.keys(
                at_q, q,
                QuerySettings._fields,
            )
            users = []
            raw_users = q.get("users") or []
            if not isinstance(raw_users, list):
                raise self.fail(at_q + ("users",), f"wrong type: found {describe(raw_users)}, expected a list of users")
            for i, u in enumerate(raw_users):
                at_u = at_q + ("users", i)
                entry = self.mapping(at_u, u, "a user (name, password)")
                self.keys(at_u, entry, ("name", "password", "admin"), ("name", "password"))
                users.append(self.build(at_u, QueryUser, dict(entry)))
            tls = None
            if q.get("tls") is not None:
                at_t = at_q + ("tls",)
                t = self.mapping(at_t, q["tls"], "a mapping (cert, key)")
                self.keys(at_t, t, ("cert", "key"), ("cert", "key"))
                tls = self.build(at_t, QueryTls, dict(t))
            cfg.query(self.build(at_q, QuerySettings, {
                "listen": q.get("listen"), "users": users, "tls": tls,
                "statement_timeout": q.get("statement_timeout"),
                "max_connections": q.get("max_connections"),
                "max_query_memory": q.get("max_query_memory"),
                "target_partitions": q.get("target_partitions"),
                "max_memory": q.get("max_memory"),
                "spill_path": q.get("spill_path"),
                "max_concurrent_statements": q.get("max_concurrent_statements"),
                "log_min_duration": q.get("log_min_duration"),
            }))
        if "metrics" in settings:
            at_m: Tuple[Segment, ...] = ("skippr", "metrics")
            m = self.mapping(at_m, settings["metrics"], "a mapping (listen)")
            self.keys(at_m, m, ("listen",))
            cfg.metrics(self.build(at_m, MetricsSettings, {"listen": m.get("listen")}))
        if "reconnect" in settings:
            at_r: Tuple[Segment, ...] = ("skippr", "reconnect")
            r = self.mapping(at_r, settings["reconnect"], "a mapping (max_backoff, give_up_after, peer_timeout)")
            self.keys(at_r, r, ReconnectSettings._fields)
            cfg.reconnect(self.build(at_r, ReconnectSettings, {k: r.get(k) for k in ReconnectSettings._fields}))
        if "lease" in settings:
            at_l: Tuple[Segment, ...] = ("skippr", "lease")
            lm = self.mapping(at_l, settings["lease"], "a mapping (renew_every, expire_after)")
            self.keys(at_l, lm, LeaseSettings._fields)
            cfg.lease(self.build(at_l, LeaseSettings, {k: lm.get(k) for k in LeaseSettings._fields}))

        # data_sources
        sources = self.mapping(("data_sources",), top.get("data_sources"), "a mapping of data sources")
        for name, value in sources.items():
            at: Tuple[Segment, ...] = ("data_sources", name)
            entry = self.mapping(at, value, "a data source (a mapping with one connector key)")
            self.keys(at, entry, ("Postgres",))
            if "Postgres" not in entry:
                raise self.fail(at, "a data source needs exactly one connector key; allowed: Postgres")
            fields = self.mapping(at + ("Postgres",), entry["Postgres"], "the Postgres settings (a mapping)")
            self.keys(at + ("Postgres",), fields, _POSTGRES_KEYS, _POSTGRES_REQUIRED)
            cfg._data_sources[self.name(at, name)] = self.build(at + ("Postgres",), DataSourcePostgres, fields)

        # schema_sinks, before the data sinks that link them
        schema_sinks = self.mapping(("schema_sinks",), top.get("schema_sinks"), "a mapping of schema sinks")
        for name, value in schema_sinks.items():
            at = ("schema_sinks", name)
            entry = self.mapping(at, value, "a schema sink (a mapping with one connector key)")
            self.keys(at, entry, tuple(_SINK_CLASSES))
            cfg._schema_sinks[self.name(at, name)] = self.connector(at, entry, "a schema sink")

        # data_sinks
        sinks = self.mapping(("data_sinks",), top.get("data_sinks"), "a mapping of data sinks")
        for name, value in sinks.items():
            at = ("data_sinks", name)
            entry = self.mapping(at, value, "a data sink (a mapping with one connector key)")
            self.keys(at, entry, (*_SINK_CLASSES, "schema_sink"))
            connector = self.connector(at, entry, "a data sink")
            link = None
            if entry.get("schema_sink") is not None:
                link = self.reference(
                    at + ("schema_sink",), entry["schema_sink"], "schema_sinks", list(cfg._schema_sinks)
                )
            cfg._data_sinks[self.name(at, name)] = DataSinkDef(connector, link)

        # pipelines
        pipelines = self.mapping(("pipelines",), top.get("pipelines"), "a mapping of pipelines")
        for name, value in pipelines.items():
            at = ("pipelines", name)
            if not is_simple_name(name):
                raise self.fail(at, f"`{name}` is not a valid pipeline name: use letters, digits and `_`")
            entry = self.mapping(at, value, "a pipeline (a mapping)")
            self.keys(
                at, entry,
                ("data_source", "data_sink", "commit_interval", "transaction_memory_budget_mb",
                 "key_index_memory_budget_mb", "maintenance", "consistent_cuts", "tables"),
                ("data_source", "data_sink"),
            )
            source = self.reference(at + ("data_source",), entry["data_source"], "data_sources", list(cfg._data_sources))
            sink = self.reference(at + ("data_sink",), entry["data_sink"], "data_sinks", list(cfg._data_sinks))
            cfg._pipelines[name] = self.build(
                at, Pipeline,
                {"data_source": DataSourceRef(source), "data_sink": DataSinkRef(sink),
                 "commit_interval": entry.get("commit_interval"),
                 "transaction_memory_budget_mb": entry.get("transaction_memory_budget_mb"),
                 "key_index_memory_budget_mb": entry.get("key_index_memory_budget_mb"),
                 "maintenance": self.maintenance(at + ("maintenance",), entry),
                 "consistent_cuts": self.consistent_cuts(at + ("consistent_cuts",), entry),
                 "tables": self.tables(at + ("tables",), entry)},
            )
            unlisted = cfg._unlisted_table(cfg._pipelines[name])
            if unlisted is not None:
                raise self.fail(at + ("tables", unlisted[0]), unlisted[1])
            changelog = cfg._changelog_problem(cfg._pipelines[name])
            if changelog is not None:
                table, last, message = changelog
                raise self.fail(at + ("tables", table, "changelog") + (("table",) if last == "table" else ()), message)
        return cfg

    def tables(self, at: Tuple[Segment, ...], entry: Dict[str, Any]) -> Optional[Dict[str, PipelineTable]]:
        """``pipelines.<p>.tables``, if present: each table's :class:`PipelineTable`, with the
        ``partition_by`` and ``sort_by`` entries of a flow list that YAML split at their commas
        joined back."""
        if entry.get("tables") is None:
            return None
        tables = self.mapping(
            at, entry["tables"], "a mapping from table name to its settings (partition_by, sort_by, exclude_columns, changelog)"
        )
        out: Dict[str, PipelineTable] = {}
        for table, value in tables.items():
            at_t = at + (table,)
            settings = self.mapping(at_t, value, "the table's settings (partition_by, sort_by, exclude_columns, changelog)")
            self.keys(at_t, settings, PipelineTable._fields)
            kwargs: Dict[str, Any] = {}
            starts: Dict[str, List[int]] = {}
            named = isinstance(settings.get("changelog"), dict)
            if settings.get("changelog") is not None:
                settings = {**settings, "changelog": self.changelog(at_t + ("changelog",), settings["changelog"])}
            for field in PipelineTable._fields:
                items = settings.get(field)
                # Only layout entries are joined back (a column name has no parentheses).
                if isinstance(items, list) and field in ("partition_by", "sort_by"):
                    joined = rejoin(items)
                    starts[field] = [i for i, _ in joined]
                    items = [e for _, e in joined]
                kwargs[field] = items
            try:
                out[table] = PipelineTable(**kwargs)
            except ConfigError as e:
                segs = list(e.segments)
                if segs == ["changelog"] and named:
                    segs.append("table")
                if len(segs) == 2 and isinstance(segs[0], str) and isinstance(segs[1], int):
                    # Name the item the entry starts at in the file.
                    first = starts.get(segs[0], [])
                    if segs[1] < len(first):
                        segs[1] = first[segs[1]]
                raise self.fail(at_t + tuple(segs), e.message) from None
        return out

    def changelog(self, at: Tuple[Segment, ...], value: Any) -> Union[bool, str]:
        """``changelog: true``, ``false`` or ``{table: <name>}``, as PipelineTable takes it."""
        if isinstance(value, bool):
            return value
        if isinstance(value, str):
            raise self.fail(at, changelog_text_problem(value))
        if not isinstance(value, dict):
            raise self.fail(at, f"wrong type: found {describe(value)}, expected `true`, `false` or `{{table: <name>}}`")
        self.keys(at, value, ("table",), ("table",))
        name = value["table"]
        if not isinstance(name, str):
            raise self.fail(at + ("table",), f"wrong type: found {describe(name)}, expected the changelog table's name")
        return name

    def maintenance(self, at: Tuple[Segment, ...], entry: Dict[str, Any]) -> Optional[MaintenanceSettings]:
        """``pipelines.<p>.maintenance``, if present."""
        if "maintenance" not in entry:
            return None
        m = self.mapping(at, entry["maintenance"], "a mapping of maintenance settings")
        self.keys(at, m, MaintenanceSettings._fields)
        settings: MaintenanceSettings = self.build(
            at, MaintenanceSettings, {k: m.get(k) for k in MaintenanceSettings._fields}
        )
        return settings

    def consistent_cuts(self, at: Tuple[Segment, ...], entry: Dict[str, Any]) -> Optional[ConsistentCuts]:
        """``pipelines.<p>.consistent_cuts``, if present."""
        if "consistent_cuts" not in entry:
            return None
        m = self.mapping(at, entry["consistent_cuts"] or {}, "a mapping of consistent cut settings (every, keep)")
        self.keys(at, m, ConsistentCuts._fields)
        cuts: ConsistentCuts = self.build(at, ConsistentCuts, {k: m.get(k) for k in ConsistentCuts._fields})
        return cuts

    def name(self, at: Tuple[Segment, ...], name: str) -> str:
        if not name.strip():
            raise self.fail(at, "names must not be empty")
        return name


__all__ = ["Config"]
