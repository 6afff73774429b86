"""An Iceberg REST catalog server for the end-to-end tests, plus the helpers that start it.

The suite runs without network or Docker, so a test that needs a REST catalog (the `RestIceberg`
sink, or a reader that goes through one) starts this server on loopback. The catalog work is
done by a real Iceberg library, PyIceberg's `SqlCatalog` over sqlite; this module is only the
HTTP layer of the Iceberg REST protocol (apache/iceberg open-api/rest-catalog-open-api.yaml) in
front of it: request bodies are parsed with PyIceberg's own pydantic models of the spec
(`CreateTableRequest`, `CommitTableRequest` with its `TableRequirement`/`TableUpdate` unions) and
every answer is a spec response or a spec `ErrorModel`.

Run it as a program::

    python tests/rest_catalog.py --port 8181 --warehouse /tmp/wh --db /tmp/wh/catalog.db \
        [--prefix p] [--warehouse-name wh] [--credential id:secret] [--token T] \
        [--read-only-token T] [--token-ttl 3600] [--no-transactions] \
        [--vend s3.access-key-id=...] [--catalog-prop s3.endpoint=...] \
        [--config-default k=v] [--config-override k=v] [--port-file F]

`--warehouse` is a local folder (tables under file:// paths) or an `s3://bucket/prefix` location
(then `--catalog-prop s3.endpoint=... s3.access-key-id=...` tell PyIceberg how to reach it, e.g.
moto's server). `--port 0` picks a free port; `--port-file` receives the one bound.

What a client sees:

* `GET /v1/config[?warehouse=NAME]`: defaults, overrides (with `prefix` when `--prefix` is
  given: every other route is then under `/v1/{prefix}/`) and the `endpoints` it serves. A
  warehouse other than `--warehouse-name` (or the warehouse location itself) is a 404.
* `POST /v1/oauth/tokens`: OAuth2 client credentials (form fields or HTTP Basic) for
  `--credential id:secret`, and token exchange of a still valid token; tokens are opaque and
  expire after `--token-ttl` seconds. `--token T` also accepts a static bearer token,
  `--read-only-token T` one that may only read (writes get 403). With none of the three there
  is no authentication; with any, every other route needs a valid, unexpired bearer token (401).
* namespaces (list, create, load, exists, drop, properties), tables (list, create, load,
  exists, commit, drop with purge, rename, register, credentials) and
  `POST /v1/{prefix}/transactions/commit` (all requirements of all tables are checked under
  one lock before anything is written, and every table's pointer moves in one sqlite
  transaction; `--no-transactions` removes the route: 404, and it is not advertised).
* A table load answers with an `ETag` (of the metadata location); `If-None-Match` with that tag
  gets `304 Not Modified` and no body.
* Vended credentials: a load or create with `X-Iceberg-Access-Delegation: vended-credentials`
  gets the `--vend k=v` options in the LoadTableResult's `config` and `storage-credentials`.

Test-only routes, outside `/v1` and without authentication:

* `GET /_test/requests`: every request so far (method, path, query, whether it carried an
  Authorization header and its scheme, its X-Iceberg-Access-Delegation header, the answer's status, and the
  tables a commit touched); `POST /_test/reset` clears that log.
* `POST /_test/faults` with a JSON list of `{"method", "path" (a regex matched against the whole
  path), "status", "count" (default 1), "message", "after"}` answers the next matching requests
  with that error instead of serving them, or with `"after": true` serves them and then answers
  with the error (a lost answer: the change is made, the client cannot know). It replaces the
  list; `[]` clears it.
* `GET /_test/health`: 200 once the server serves.

Nothing that authenticates (secrets, tokens, Authorization headers, request bodies) is logged.

In tests, `RestCatalogServer` starts the program as a subprocess and `pyiceberg_client` builds a
PyIceberg `RestCatalog` for it.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import math
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterable, Sequence

#: The namespace separator of the REST spec in paths and the `parent` query parameter.
NS_SEP = "\x1f"

ACCESS_DELEGATION_HEADER = "X-Iceberg-Access-Delegation"


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


class RestError(Exception):
    """An answer in the spec's ErrorModel shape."""

    def __init__(self, code: int, type_: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.type = type_
        self.message = message

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "code": self.code}}


class OAuthError(Exception):
    """An answer of the token endpoint in RFC 6749's error shape."""

    def __init__(self, code: int, error: str, description: str) -> None:
        super().__init__(description)
        self.code = code
        self.error = error
        self.description = description


def _map_exception(e: Exception) -> RestError:
    """PyIceberg's and pydantic's exceptions as the spec's error types and codes."""
    from pydantic import ValidationError
    from pyiceberg import exceptions as x

    text = str(e) or type(e).__name__
    if isinstance(e, RestError):
        return e
    if isinstance(e, (ValidationError, json.JSONDecodeError)):
        return RestError(400, "BadRequestException", f"malformed request body: {text}")
    if isinstance(e, x.NoSuchNamespaceError):
        return RestError(404, "NoSuchNamespaceException", text)
    if isinstance(e, x.NoSuchTableError):
        return RestError(404, "NoSuchTableException", text)
    if isinstance(e, (x.TableAlreadyExistsError, x.NamespaceAlreadyExistsError)):
        return RestError(409, "AlreadyExistsException", text)
    if isinstance(e, x.NamespaceNotEmptyError):
        return RestError(409, "NamespaceNotEmptyException", text)
    if isinstance(e, x.CommitFailedException):
        return RestError(409, "CommitFailedException", text)
    if isinstance(e, (ValueError, x.ValidationError, NotImplementedError)):
        return RestError(400, "BadRequestException", text)
    return RestError(500, type(e).__name__, text)


# --------------------------------------------------------------------------------------------
# The catalog behind the HTTP layer
# --------------------------------------------------------------------------------------------


class _Named:
    """What `SqlCatalog.commit_table` needs of its `table` argument: the identifier."""

    def __init__(self, identifier: tuple[str, ...]) -> None:
        self._identifier = identifier

    def name(self) -> tuple[str, ...]:
        return self._identifier


def _metadata_json(metadata) -> dict:
    return json.loads(metadata.model_dump_json())


class Backend:
    """PyIceberg's SqlCatalog, every operation under one lock (sqlite has one writer; the lock
    also makes a multi-table commit's check-then-apply atomic against single commits)."""

    def __init__(self, name: str, warehouse: str, db: str, props: dict[str, str]) -> None:
        from pyiceberg.catalog.sql import SqlCatalog

        self.lock = threading.RLock()
        self.catalog = SqlCatalog(name, uri=f"sqlite:///{db}", warehouse=warehouse, **props)

    # namespaces ------------------------------------------------------------------------------

    def list_namespaces(self, parent: tuple[str, ...]) -> list[list[str]]:
        with self.lock:
            return sorted(list(ns) for ns in self.catalog.list_namespaces(parent))

    def create_namespace(self, ns: tuple[str, ...], props: dict[str, str]) -> dict:
        with self.lock:
            self.catalog.create_namespace(ns, props)
            return {"namespace": list(ns), "properties": self.catalog.load_namespace_properties(ns)}

    def load_namespace(self, ns: tuple[str, ...]) -> dict:
        with self.lock:
            return {"namespace": list(ns), "properties": self.catalog.load_namespace_properties(ns)}

    def namespace_exists(self, ns: tuple[str, ...]) -> bool:
        with self.lock:
            return self.catalog.namespace_exists(ns)

    def drop_namespace(self, ns: tuple[str, ...]) -> None:
        with self.lock:
            self.catalog.drop_namespace(ns)

    def update_namespace_properties(self, ns: tuple[str, ...], removals: Sequence[str], updates: dict[str, str]) -> dict:
        with self.lock:
            s = self.catalog.update_namespace_properties(ns, set(removals), updates)
            return {"updated": s.updated, "removed": s.removed, "missing": s.missing}

    # tables ----------------------------------------------------------------------------------

    def list_tables(self, ns: tuple[str, ...]) -> list[dict]:
        with self.lock:
            if not self.catalog.namespace_exists(ns):
                from pyiceberg.exceptions import NoSuchNamespaceError

                raise NoSuchNamespaceError(f"Namespace does not exist: {'.'.join(ns)}")
            idents = sorted(self.catalog.list_tables(ns))
        return [{"namespace": list(i[:-1]), "name": i[-1]} for i in idents]

    def create_table(self, ns: tuple[str, ...], body: dict) -> tuple[str | None, Any]:
        """Returns (metadata location, metadata); the location is None for a staged create."""
        from pyiceberg.catalog.rest import CreateTableRequest
        from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
        from pyiceberg.table.sorting import UNSORTED_SORT_ORDER

        body = dict(body)
        # The spec makes a partition field's `field-id` and the spec's `spec-id` optional;
        # PyIceberg's model requires them: number them as a catalog would (from 1000).
        spec = body.get("partition-spec")
        if isinstance(spec, dict):
            spec = dict(spec)
            spec.setdefault("spec-id", 0)
            fields = []
            for i, f in enumerate(spec.get("fields") or []):
                f = dict(f) if isinstance(f, dict) else f
                if isinstance(f, dict):
                    f.setdefault("field-id", 1000 + i)
                fields.append(f)
            spec["fields"] = fields
            body["partition-spec"] = spec
        body.setdefault("location", None)
        body.setdefault("partition-spec", None)
        body.setdefault("write-order", None)
        req = CreateTableRequest.model_validate(body)
        ident = (*ns, req.name)
        args = dict(
            schema=req.table_schema,
            location=req.location,
            partition_spec=req.partition_spec or UNPARTITIONED_PARTITION_SPEC,
            sort_order=req.write_order or UNSORTED_SORT_ORDER,
            properties=req.properties,
        )
        with self.lock:
            if req.stage_create:
                from pyiceberg.exceptions import NoSuchNamespaceError, TableAlreadyExistsError

                if not self.catalog.namespace_exists(ns):
                    raise NoSuchNamespaceError(f"Namespace does not exist: {'.'.join(ns)}")
                if self.catalog.table_exists(ident):
                    raise TableAlreadyExistsError(f"Table {'.'.join(ident)} already exists")
                staged = self.catalog._create_staged_table(ident, **args)
                return None, staged.metadata
            table = self.catalog.create_table(ident, **args)
            return table.metadata_location, table.metadata

    def load_table(self, ident: tuple[str, ...]) -> tuple[str, Any]:
        with self.lock:
            table = self.catalog.load_table(ident)
            return table.metadata_location, table.metadata

    def table_exists(self, ident: tuple[str, ...]) -> bool:
        with self.lock:
            return self.catalog.table_exists(ident)

    def drop_table(self, ident: tuple[str, ...], purge: bool) -> None:
        with self.lock:
            if purge:
                self.catalog.purge_table(ident)
            else:
                self.catalog.drop_table(ident)

    def rename_table(self, src: tuple[str, ...], dst: tuple[str, ...]) -> None:
        with self.lock:
            self.catalog.rename_table(src, dst)

    def register_table(self, ident: tuple[str, ...], metadata_location: str, overwrite: bool) -> tuple[str, Any]:
        with self.lock:
            if overwrite and self.catalog.table_exists(ident):
                self.catalog.drop_table(ident)
            table = self.catalog.register_table(ident, metadata_location)
            return table.metadata_location, table.metadata

    # commits ---------------------------------------------------------------------------------

    @staticmethod
    def _parse_change(body: Any, ident: tuple[str, ...] | None = None):
        from pyiceberg.table import CommitTableRequest

        if not isinstance(body, dict):
            raise RestError(400, "BadRequestException", "a table commit must be a JSON object")
        if ident is not None:
            body = dict(body)
            body.setdefault("identifier", {"namespace": list(ident[:-1]), "name": ident[-1]})
        elif "identifier" not in body:
            raise RestError(400, "BadRequestException", "every table change of a transaction needs its identifier")
        req = CommitTableRequest.model_validate(body)
        return req, (*req.identifier.namespace.root, req.identifier.name)

    @staticmethod
    def _creates(req) -> bool:
        from pyiceberg.table.update import AssertCreate

        return any(isinstance(r, AssertCreate) for r in req.requirements)

    def commit_table(self, ident: tuple[str, ...], body: Any) -> tuple[str, Any]:
        from pyiceberg.exceptions import NoSuchTableError

        req, body_ident = self._parse_change(body, ident)
        if body_ident != ident:
            raise RestError(400, "BadRequestException", f"identifier {'.'.join(body_ident)} in the body is not the table of the path, {'.'.join(ident)}")
        with self.lock:
            if not self._creates(req) and not self.catalog.table_exists(ident):
                raise NoSuchTableError(f"Table does not exist: {'.'.join(ident)}")
            resp = self.catalog.commit_table(_Named(ident), req.requirements, req.updates)
            return resp.metadata_location, resp.metadata

    def commit_transaction(self, body: Any) -> list[str]:
        """All of a CommitTransactionRequest or nothing: every table is staged (requirements
        checked, updates applied in memory) before any file is written, then the new metadata
        files are written and every table's pointer moves in one sqlite transaction that
        compares each old pointer (so a writer outside this server cannot be overwritten)."""
        from pyiceberg.catalog import Catalog
        from pyiceberg.catalog.sql import IcebergTables
        from pyiceberg.exceptions import CommitFailedException, NoSuchTableError, TableAlreadyExistsError
        from sqlalchemy import insert, update
        from sqlalchemy.exc import IntegrityError
        from sqlalchemy.orm import Session

        if not isinstance(body, dict) or not isinstance(body.get("table-changes"), list):
            raise RestError(400, "BadRequestException", "a CommitTransactionRequest needs a `table-changes` list")
        changes = [self._parse_change(c) for c in body["table-changes"]]
        cat = self.catalog
        with self.lock:
            # identifier -> [pointer when the transaction started (None: created here), staged table]
            staged: dict[tuple[str, ...], list] = {}
            for req, ident in changes:
                if ident in staged:
                    base = staged[ident][1]
                else:
                    try:
                        base = cat.load_table(ident)
                    except NoSuchTableError:
                        if not self._creates(req):
                            raise
                        base = None
                    staged[ident] = [base.metadata_location if base else None, base]
                new = cat._update_and_stage_table(base, ident, req.requirements, req.updates)
                if base is not None and new.metadata == base.metadata:
                    continue
                staged[ident][1] = new
            moved = [(i, old, new) for i, (old, new) in staged.items() if new is not None and new.metadata_location != old]
            for _, _, new in moved:
                cat._write_metadata(metadata=new.metadata, io=new.io, metadata_path=new.metadata_location)
            with Session(cat.engine) as session:
                for ident, old, new in moved:
                    ns = Catalog.namespace_to_string(ident[:-1])
                    if old is None:
                        try:
                            session.execute(insert(IcebergTables).values(**cat._create_table_row(ns, ident[-1], new.metadata_location)))
                        except IntegrityError as e:
                            raise TableAlreadyExistsError(f"Table {'.'.join(ident)} already exists") from e
                        continue
                    res = session.execute(
                        update(IcebergTables)
                        .where(
                            IcebergTables.catalog_name == cat.name,
                            IcebergTables.table_namespace == ns,
                            IcebergTables.table_name == ident[-1],
                            IcebergTables.metadata_location == old,
                        )
                        .values(metadata_location=new.metadata_location, previous_metadata_location=old)
                    )
                    if res.rowcount < 1:
                        raise CommitFailedException(f"Table has been updated by another process: {'.'.join(ident)}")
                session.commit()
        return [".".join(i) for _, i in changes]


# --------------------------------------------------------------------------------------------
# Authentication
# --------------------------------------------------------------------------------------------


class Auth:
    def __init__(self, credential: str | None, token: str | None, read_only_token: str | None, ttl: float) -> None:
        self.client_id, self.client_secret = (credential.split(":", 1) if credential else (None, None))
        self.static = token
        self.read_only = read_only_token
        self.ttl = ttl
        self.issued: dict[str, float] = {}  # token -> expiry (time.monotonic)
        self.lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return bool(self.client_id is not None or self.static or self.read_only)

    def _issue(self) -> str:
        token = secrets.token_urlsafe(24)
        with self.lock:
            self.issued[token] = time.monotonic() + self.ttl
        return token

    def _valid(self, token: str) -> bool:
        if token and token in (self.static, self.read_only):
            return True
        with self.lock:
            expiry = self.issued.get(token)
        return expiry is not None and time.monotonic() < expiry

    def token_endpoint(self, headers, body: bytes) -> dict:
        form = {k: v[-1] for k, v in urllib.parse.parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True).items()}
        client_id, client_secret = form.get("client_id"), form.get("client_secret")
        basic = headers.get("Authorization", "")
        if basic.lower().startswith("basic "):
            try:
                cid, _, csecret = base64.b64decode(basic[6:].strip()).decode().partition(":")
                client_id, client_secret = urllib.parse.unquote(cid), urllib.parse.unquote(csecret)
            except Exception:
                raise OAuthError(400, "invalid_request", "malformed Basic authorization")
        grant = form.get("grant_type")
        if grant == "client_credentials":
            if self.client_id is None:
                raise OAuthError(401, "invalid_client", "this catalog has no OAuth2 client")
            if client_id != self.client_id or client_secret != self.client_secret:
                raise OAuthError(401, "invalid_client", "unknown client or wrong secret")
        elif grant == "urn:ietf:params:oauth:grant-type:token-exchange":
            if not self._valid(form.get("subject_token", "")):
                raise OAuthError(401, "invalid_client", "the subject token is not valid")
        elif grant is None:
            raise OAuthError(400, "invalid_request", "missing grant_type")
        else:
            raise OAuthError(400, "unsupported_grant_type", f"grant_type {grant} is not supported")
        out = {
            "access_token": self._issue(),
            "token_type": "bearer",
            "expires_in": max(1, math.ceil(self.ttl)),  # an integer in RFC 6749
            "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
        }
        if form.get("scope"):
            out["scope"] = form["scope"]
        return out

    def check(self, headers, method: str) -> None:
        if not self.enabled:
            return
        value = headers.get("Authorization")
        if not value:
            raise RestError(401, "NotAuthorizedException", "missing Authorization: Bearer token")
        scheme, _, token = value.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise RestError(401, "NotAuthorizedException", "the Authorization header is not a bearer token")
        if token in (self.static, self.read_only):
            pass
        else:
            with self.lock:
                expiry = self.issued.get(token)
            if expiry is None:
                raise RestError(401, "NotAuthorizedException", "unknown bearer token")
            if time.monotonic() >= expiry:
                raise RestError(401, "NotAuthorizedException", "the bearer token has expired")
        if token == self.read_only and token != self.static and method not in ("GET", "HEAD"):
            raise RestError(403, "ForbiddenException", f"this token may only read; {method} is a write")


# --------------------------------------------------------------------------------------------
# HTTP layer
# --------------------------------------------------------------------------------------------


class Server:
    """Configuration and state shared by the request handlers."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.prefix = (args.prefix or "").strip("/")
        self.warehouse_name = args.warehouse_name
        self.warehouse = _warehouse_uri(args.warehouse)
        db = args.db or (str(Path(args.warehouse) / "catalog.db") if "://" not in args.warehouse else None)
        if not db:
            raise SystemExit("--db is needed when the warehouse is not a local folder")
        Path(db).parent.mkdir(parents=True, exist_ok=True)
        if "://" not in args.warehouse:
            Path(args.warehouse).mkdir(parents=True, exist_ok=True)
        self.backend = Backend(args.warehouse_name, self.warehouse, db, _kv(args.catalog_prop))
        self.auth = Auth(args.credential, args.token, args.read_only_token, args.token_ttl)
        self.transactions = not args.no_transactions
        self.vend = _kv(args.vend)
        self.defaults = _kv(args.config_default)
        self.overrides = _kv(args.config_override)
        self.log_lock = threading.Lock()
        self.requests: list[dict] = []
        self.faults: list[dict] = []

    def endpoints(self) -> list[str]:
        p = "/v1/{prefix}"
        eps = [
            f"GET {p}/namespaces",
            f"POST {p}/namespaces",
            f"GET {p}/namespaces/{{namespace}}",
            f"HEAD {p}/namespaces/{{namespace}}",
            f"DELETE {p}/namespaces/{{namespace}}",
            f"POST {p}/namespaces/{{namespace}}/properties",
            f"GET {p}/namespaces/{{namespace}}/tables",
            f"POST {p}/namespaces/{{namespace}}/tables",
            f"GET {p}/namespaces/{{namespace}}/tables/{{table}}",
            f"HEAD {p}/namespaces/{{namespace}}/tables/{{table}}",
            f"POST {p}/namespaces/{{namespace}}/tables/{{table}}",
            f"DELETE {p}/namespaces/{{namespace}}/tables/{{table}}",
            f"GET {p}/namespaces/{{namespace}}/tables/{{table}}/credentials",
            f"POST {p}/namespaces/{{namespace}}/register",
            f"POST {p}/tables/rename",
        ]
        if self.transactions:
            eps.append(f"POST {p}/transactions/commit")
        return eps


def _kv(items: Iterable[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or ():
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise SystemExit(f"expected key=value, got {item.split('=')[0]!r}...")
        out[k] = v
    return out


def _warehouse_uri(warehouse: str) -> str:
    if "://" in warehouse:
        return warehouse.rstrip("/")
    return Path(warehouse).resolve().as_uri()


def _split_ns(segment: str) -> tuple[str, ...]:
    parts = tuple(segment.split(NS_SEP))
    if not all(parts):
        raise RestError(400, "BadRequestException", "empty namespace level")
    return parts


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "SkipprTestRestCatalog/1"
    # Headers and body go out in separate writes on a kept-alive connection: without
    # TCP_NODELAY the body waits for the client's delayed ACK (up to 40 ms an answer).
    disable_nagle_algorithm = True
    state: Server  # set on the subclass made by serve()

    # plumbing --------------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._handle("GET")

    def do_HEAD(self) -> None:
        self._handle("HEAD")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # one line per request is written by _handle, without headers or bodies

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _send(self, status: int, body: Any = None, content_type: str = "application/json",
              headers: dict[str, str] | None = None) -> None:
        lost = getattr(self, "_lost_answer", None)
        if lost is not None and status < 400:
            # The request was served; the client gets an error instead of its answer.
            self._lost_answer = None
            status, body = lost.code, lost.body()
        data = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        # The log shows the status before the client can read the answer: a test that asks for the
        # log right after its request must find it complete.
        self._status = status
        entry = getattr(self, "_entry", None)
        if entry is not None:
            with self.state.log_lock:
                entry["status"] = status
        self.send_response(status)
        if data:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        if status in (401,):
            self.send_header("WWW-Authenticate", 'Bearer realm="iceberg"')
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if data and self.command != "HEAD":
            self.wfile.write(data)

    def _handle(self, method: str) -> None:
        st = self.state
        started = time.monotonic()
        self._status = 0
        self._lost_answer = None
        self._entry = None
        url = urllib.parse.urlsplit(self.path)
        path = url.path
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query, keep_blank_values=True).items()}
        entry: dict | None = None
        try:
            body = self._read_body()
            if path.startswith("/_test/"):
                return self._test_route(method, path, body)
            entry = {
                "method": method,
                "path": path,
                "query": url.query,
                "authorized": "Authorization" in self.headers,
                "auth_scheme": (self.headers.get("Authorization") or "").split(" ")[0] or None,
                "access_delegation": self.headers.get(ACCESS_DELEGATION_HEADER),
                "status": None,
            }
            with st.log_lock:
                st.requests.append(entry)
            self._entry = entry
            self._dispatch(method, path, query, body, entry)
        except OAuthError as e:
            self._send(e.code, {"error": e.error, "error_description": e.description})
        except Exception as e:  # noqa: BLE001 - every failure is an ErrorModel
            err = _map_exception(e)
            if err.code >= 500:
                traceback.print_exc(file=sys.stderr)
            self._send(err.code, err.body())
        finally:
            if entry is not None:
                with st.log_lock:
                    entry["status"] = self._status
                sys.stderr.write(f"{method} {path} -> {self._status} ({(time.monotonic() - started) * 1000:.0f} ms)\n")
                sys.stderr.flush()

    def _test_route(self, method: str, path: str, body: bytes) -> None:
        st = self.state
        if (method, path) == ("GET", "/_test/health"):
            return self._send(200, {"ok": True})
        if (method, path) == ("GET", "/_test/requests"):
            with st.log_lock:
                log = [dict(e) for e in st.requests]
            return self._send(200, log)
        if (method, path) == ("POST", "/_test/reset"):
            with st.log_lock:
                st.requests.clear()
            return self._send(204)
        if (method, path) == ("POST", "/_test/faults"):
            faults = json.loads(body or b"[]")
            if not isinstance(faults, list):
                raise RestError(400, "BadRequestException", "faults must be a JSON list")
            parsed = []
            for f in faults:
                parsed.append({
                    "method": str(f.get("method", "")).upper() or None,
                    "path": re.compile(f.get("path", ".*")),
                    "status": int(f["status"]),
                    "count": int(f.get("count", 1)),
                    "type": f.get("type"),
                    "message": f.get("message", "injected failure"),
                    "after": bool(f.get("after", False)),
                })
            with st.log_lock:
                st.faults = parsed
            return self._send(204)
        raise RestError(404, "NotFoundException", f"no test route {method} {path}")

    def _fault(self, method: str, path: str) -> None:
        st = self.state
        with st.log_lock:
            for f in st.faults:
                if f["count"] > 0 and (f["method"] in (None, method)) and f["path"].fullmatch(path):
                    f["count"] -= 1
                    status = f["status"]
                    type_ = f["type"] or {
                        400: "BadRequestException", 401: "NotAuthorizedException", 403: "ForbiddenException",
                        404: "NoSuchTableException", 409: "CommitFailedException", 419: "AuthenticationTimeoutException",
                        500: "InternalServerError", 503: "ServiceUnavailableException",
                    }.get(status, "RESTException")
                    if f["after"]:
                        # Served first, then answered with the error: a lost answer.
                        self._lost_answer = RestError(status, type_, f["message"])
                        return
                    raise RestError(status, type_, f["message"])

    # routes ----------------------------------------------------------------------------------

    def _dispatch(self, method: str, path: str, query: dict[str, str], raw: bytes, entry: dict) -> None:
        st = self.state
        if not path.startswith("/v1/"):
            raise RestError(404, "NotFoundException", f"no route for {method} {path}")
        rest = path[len("/v1/"):].rstrip("/")
        # the prefix may have several segments (e.g. "catalogs/wh"): it is matched as a string
        prefixed = bool(st.prefix) and rest.startswith(st.prefix + "/")
        if prefixed:
            rest = rest[len(st.prefix) + 1:]
        segs = [urllib.parse.unquote(s) for s in rest.split("/")]
        # the token endpoint: unprefixed per the spec, also accepted under the prefix
        if segs == ["oauth", "tokens"]:
            if method != "POST":
                raise RestError(405, "MethodNotAllowedException", f"{method} is not allowed on {path}")
            self._fault(method, path)
            return self._send(200, st.auth.token_endpoint(self.headers, raw))
        st.auth.check(self.headers, method)
        self._fault(method, path)
        if segs == ["config"] and not prefixed:
            if method != "GET":
                raise RestError(405, "MethodNotAllowedException", f"{method} is not allowed on {path}")
            return self._config(query)
        if st.prefix and not prefixed:
            raise RestError(404, "NotFoundException", f"no route for {method} {path} (routes are under /v1/{st.prefix}/)")

        def body() -> Any:
            return json.loads(raw or b"null")

        def obj(what: str) -> dict:
            b = body()
            if not isinstance(b, dict):
                raise RestError(400, "BadRequestException", f"{what} must be a JSON object")
            return b

        def allow(*methods: str) -> None:
            if method not in methods:
                raise RestError(405, "MethodNotAllowedException", f"{method} is not allowed on {path}")

        be = st.backend
        n = len(segs)
        if segs == ["namespaces"]:
            allow("GET", "POST")
            if method == "GET":
                parent = _split_ns(query["parent"]) if query.get("parent") else ()
                return self._send(200, {"namespaces": be.list_namespaces(parent)})
            b = obj("CreateNamespaceRequest")
            if not isinstance(b.get("namespace"), list) or not b["namespace"]:
                raise RestError(400, "BadRequestException", "CreateNamespaceRequest needs a non-empty `namespace` list")
            props = b.get("properties") or {}
            if not isinstance(props, dict):
                raise RestError(400, "BadRequestException", "namespace properties must be a JSON object")
            return self._send(200, be.create_namespace(tuple(str(x) for x in b["namespace"]), {str(k): str(v) for k, v in props.items()}))
        if n >= 2 and segs[0] == "namespaces":
            ns = _split_ns(segs[1])
            if n == 2:
                allow("GET", "HEAD", "DELETE")
                if method == "HEAD":
                    return self._send(204 if be.namespace_exists(ns) else 404)
                if method == "DELETE":
                    be.drop_namespace(ns)
                    return self._send(204)
                return self._send(200, be.load_namespace(ns))
            if n == 3 and segs[2] == "properties":
                allow("POST")
                b = obj("UpdateNamespacePropertiesRequest")
                removals, updates = b.get("removals") or [], b.get("updates") or {}
                if not isinstance(removals, list) or not isinstance(updates, dict):
                    raise RestError(400, "BadRequestException", "`removals` must be a list and `updates` an object")
                return self._send(200, be.update_namespace_properties(ns, [str(r) for r in removals], {str(k): str(v) for k, v in updates.items()}))
            if n == 3 and segs[2] == "register":
                allow("POST")
                b = obj("RegisterTableRequest")
                if not b.get("name") or not b.get("metadata-location"):
                    raise RestError(400, "BadRequestException", "RegisterTableRequest needs `name` and `metadata-location`")
                loc, md = be.register_table((*ns, b["name"]), b["metadata-location"], bool(b.get("overwrite")))
                return self._send(200, self._load_result(loc, md))
            if n == 3 and segs[2] == "tables":
                allow("GET", "POST")
                if method == "GET":
                    return self._send(200, {"identifiers": be.list_tables(ns)})
                loc, md = be.create_table(ns, obj("CreateTableRequest"))
                return self._send(200, self._load_result(loc, md))
            if n in (4, 5) and segs[2] == "tables":
                ident = (*ns, segs[3])
                if n == 5:
                    if segs[4] != "credentials":
                        raise RestError(404, "NotFoundException", f"no route for {method} {path}")
                    allow("GET")
                    loc, md = be.load_table(ident)
                    return self._send(200, {"storage-credentials": self._storage_credentials(md)})
                allow("GET", "HEAD", "POST", "DELETE")
                if method == "HEAD":
                    return self._send(204 if be.table_exists(ident) else 404)
                if method == "GET":
                    loc, md = be.load_table(ident)
                    # The spec's ETag: the same metadata (and the same vending) is the same tag,
                    # and a client that sends it back in If-None-Match gets 304 without a body.
                    tag = '"' + hashlib.sha1(f"{loc}|{self._vending()}".encode()).hexdigest() + '"'
                    if self.headers.get("If-None-Match") == tag:
                        return self._send(304, None, headers={"ETag": tag})
                    return self._send(200, self._load_result(loc, md), headers={"ETag": tag})
                if method == "DELETE":
                    be.drop_table(ident, query.get("purgeRequested", "false").lower() == "true")
                    return self._send(204)
                entry["tables"] = [".".join(ident)]
                loc, md = be.commit_table(ident, body())
                return self._send(200, {"metadata-location": loc, "metadata": _metadata_json(md)})
        if segs == ["tables", "rename"]:
            allow("POST")
            b = obj("RenameTableRequest")
            try:
                src = (*b["source"]["namespace"], b["source"]["name"])
                dst = (*b["destination"]["namespace"], b["destination"]["name"])
            except (KeyError, TypeError):
                raise RestError(400, "BadRequestException", "RenameTableRequest needs `source` and `destination` identifiers")
            be.rename_table(src, dst)
            return self._send(204)
        if segs == ["transactions", "commit"] and st.transactions:
            allow("POST")
            b = body()
            if isinstance(b, dict) and isinstance(b.get("table-changes"), list):
                entry["tables"] = []
                for c in b["table-changes"]:
                    i = c.get("identifier") if isinstance(c, dict) else None
                    if isinstance(i, dict):
                        entry["tables"].append(".".join([*map(str, i.get("namespace") or []), str(i.get("name"))]))
            be.commit_transaction(b)
            return self._send(204)
        raise RestError(404, "NotFoundException", f"no route for {method} {path}")

    def _config(self, query: dict[str, str]) -> None:
        st = self.state
        wh = query.get("warehouse")
        if wh and wh not in (st.warehouse_name, st.warehouse, st.args.warehouse, st.warehouse + "/"):
            raise RestError(404, "NoSuchWarehouseException", f"warehouse {wh!r} does not exist (this catalog serves {st.warehouse_name!r})")
        overrides = dict(st.overrides)
        if st.prefix:
            overrides["prefix"] = st.prefix
        defaults = dict(st.defaults)
        return self._send(200, {"defaults": defaults, "overrides": overrides, "endpoints": st.endpoints()})

    def _vending(self) -> bool:
        value = self.headers.get(ACCESS_DELEGATION_HEADER) or ""
        return bool(self.state.vend) and "vended-credentials" in [v.strip() for v in value.split(",")]

    def _storage_credentials(self, metadata) -> list[dict]:
        if not self.state.vend:
            return []
        return [{"prefix": metadata.location, "config": dict(self.state.vend)}]

    def _load_result(self, location: str | None, metadata) -> dict:
        out: dict[str, Any] = {"metadata": _metadata_json(metadata), "config": {}}
        if location is not None:
            out["metadata-location"] = location
        if self._vending():
            out["config"] = dict(self.state.vend)
            out["storage-credentials"] = self._storage_credentials(metadata)
        return out


def serve(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="An Iceberg REST catalog over PyIceberg's SqlCatalog, for tests.")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True, help="0 picks a free port (see --port-file)")
    ap.add_argument("--port-file", help="write the bound port here once serving")
    ap.add_argument("--warehouse", required=True, help="a local folder or s3://bucket/prefix")
    ap.add_argument("--db", help="the sqlite file of the catalog (default <warehouse>/catalog.db for a local folder)")
    ap.add_argument("--warehouse-name", default="wh", help="the name clients ask /v1/config for")
    ap.add_argument("--prefix", help="the path prefix advertised in /v1/config's overrides")
    ap.add_argument("--credential", help="id:secret of the OAuth2 client (client credentials)")
    ap.add_argument("--token", help="a static bearer token that is always accepted")
    ap.add_argument("--read-only-token", help="a static bearer token that may only GET/HEAD (writes: 403)")
    ap.add_argument("--token-ttl", type=float, default=3600.0, help="seconds an issued token is valid")
    ap.add_argument("--no-transactions", action="store_true", help="no POST /v1/{prefix}/transactions/commit")
    ap.add_argument("--vend", action="append", default=[], metavar="K=V", help="a vended credential property")
    ap.add_argument("--catalog-prop", action="append", default=[], metavar="K=V", help="a SqlCatalog property (e.g. s3.endpoint)")
    ap.add_argument("--config-default", action="append", default=[], metavar="K=V", help="an entry of /v1/config's defaults")
    ap.add_argument("--config-override", action="append", default=[], metavar="K=V", help="an entry of /v1/config's overrides")
    args = ap.parse_args(argv)

    state = Server(args)
    handler = type("BoundHandler", (Handler,), {"state": state})
    httpd = ThreadingHTTPServer((args.host, args.port), handler)
    httpd.daemon_threads = True
    port = httpd.server_address[1]
    if args.port_file:
        tmp = Path(args.port_file + ".tmp")
        tmp.write_text(str(port))
        os.replace(tmp, args.port_file)

    def stop(*_: Any) -> None:
        threading.Thread(target=httpd.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    auth = "oauth2" if args.credential else ("token" if (args.token or args.read_only_token) else "none")
    sys.stderr.write(
        f"rest catalog on http://{args.host}:{port} warehouse={state.warehouse} name={args.warehouse_name} "
        f"prefix={state.prefix or '-'} auth={auth} transactions={'on' if state.transactions else 'off'}\n"
    )
    sys.stderr.flush()
    try:
        httpd.serve_forever(poll_interval=0.2)
    finally:
        httpd.server_close()


# --------------------------------------------------------------------------------------------
# Helpers for tests
# --------------------------------------------------------------------------------------------


def pyiceberg_client(uri: str, *, credential: str | None = None, token: str | None = None,
                     warehouse: str | None = None, name: str = "rest", **props: str):
    """PyIceberg's RestCatalog for a running server (`uri` is http://host:port, without /v1).
    `credential` ("id:secret") makes it fetch OAuth2 tokens from the server's token endpoint;
    `token` sends a static bearer token. Extra properties (e.g. "s3.endpoint") go as they are."""
    from pyiceberg.catalog.rest import RestCatalog

    p: dict[str, str] = {"uri": uri}
    if credential is not None:
        p["credential"] = credential
        p["oauth2-server-uri"] = f"{uri.rstrip('/')}/v1/oauth/tokens"
    if token is not None:
        p["token"] = token
    if warehouse is not None:
        p["warehouse"] = warehouse
    p.update(props)
    return RestCatalog(name, **p)


def duckdb_rest_connect():
    """A DuckDB connection that can attach a REST catalog: tests/conftest.py's `duckdb_connect`
    (parquet, avro and iceberg from the extension wheels, nothing downloaded) plus httpfs, which
    the iceberg extension's REST client needs for its HTTP requests (without it ATTACH tries to
    auto-install httpfs and fails offline)."""
    import glob

    import duckdb_extension_httpfs
    from conftest import duckdb_connect

    base = os.path.dirname(duckdb_extension_httpfs.__file__)
    found = glob.glob(f"{base}/**/httpfs.duckdb_extension", recursive=True)
    if not found:
        raise RuntimeError(f"httpfs.duckdb_extension not found under {base}")
    con = duckdb_connect()
    con.execute(f"LOAD '{found[0]}'")
    return con


def duckdb_attach(con, uri: str, warehouse: str, alias: str = "cat", *, credential: str | None = None,
                  token: str | None = None, vended_credentials: bool = True) -> None:
    """ATTACHes the catalog at `uri` as `alias` (DuckDB's iceberg extension: `TYPE iceberg,
    ENDPOINT`, with an iceberg secret holding the OAuth2 client or the bearer token)."""
    def lit(v: str) -> str:
        return "'" + v.replace("'", "''") + "'"

    opts = ["TYPE iceberg", f"ENDPOINT {lit(uri)}"]
    if credential is not None:
        cid, _, secret = credential.partition(":")
        con.execute(f"CREATE OR REPLACE SECRET {alias}_auth (TYPE iceberg, CLIENT_ID {lit(cid)}, CLIENT_SECRET {lit(secret)}, "
                    f"OAUTH2_SERVER_URI {lit(uri.rstrip('/') + '/v1/oauth/tokens')})")
        opts.append(f"SECRET {alias}_auth")
    elif token is not None:
        con.execute(f"CREATE OR REPLACE SECRET {alias}_auth (TYPE iceberg, TOKEN {lit(token)})")
        opts.append(f"SECRET {alias}_auth")
    else:
        opts.append("AUTHORIZATION_TYPE 'none'")
    if not vended_credentials:
        opts.append("ACCESS_DELEGATION_MODE 'none'")
    con.execute(f"ATTACH {lit(warehouse)} AS {alias} ({', '.join(opts)})")


class RestCatalogServer:
    """This module's server as a subprocess on a free loopback port, for a test's lifetime.

        with RestCatalogServer(tmp_path / "wh", credential="client:secret") as srv:
            cat = srv.client()            # PyIceberg RestCatalog with the server's credential
            srv.uri                       # http://127.0.0.1:PORT (clients add /v1/...)
            srv.requests(); srv.reset()   # the request log

    Options map to the program's flags (see the module docstring); `vend`, `catalog_props`,
    `config_defaults` and `config_overrides` are dicts. The server's stderr goes to `log_path`
    (default: `server.log` beside the sqlite file)."""

    def __init__(
        self,
        warehouse: str | os.PathLike,
        db: str | os.PathLike | None = None,
        *,
        warehouse_name: str = "wh",
        prefix: str | None = None,
        credential: str | None = None,
        token: str | None = None,
        read_only_token: str | None = None,
        token_ttl: float | None = None,
        transactions: bool = True,
        vend: dict[str, str] | None = None,
        catalog_props: dict[str, str] | None = None,
        config_defaults: dict[str, str] | None = None,
        config_overrides: dict[str, str] | None = None,
        log_path: str | os.PathLike | None = None,
        start_timeout: float = 30.0,
    ) -> None:
        self.warehouse = str(warehouse)
        if db is None:
            if "://" in self.warehouse:
                db = Path(tempfile.mkdtemp(prefix="rest-catalog-")) / "catalog.db"
            else:
                db = Path(self.warehouse) / "catalog.db"
        self.db = Path(db)
        self.warehouse_name = warehouse_name
        self.prefix = prefix
        self.credential = credential
        self.token = token
        self.read_only_token = read_only_token
        self.token_ttl = token_ttl
        self.transactions = transactions
        self.vend = dict(vend or {})
        self.catalog_props = dict(catalog_props or {})
        self.config_defaults = dict(config_defaults or {})
        self.config_overrides = dict(config_overrides or {})
        self.log_path = Path(log_path) if log_path else self.db.parent / "server.log"
        self.start_timeout = start_timeout
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None

    # lifecycle -------------------------------------------------------------------------------

    def command(self, port: int = 0, port_file: str | None = None) -> list[str]:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--port", str(port),
               "--warehouse", self.warehouse, "--db", str(self.db), "--warehouse-name", self.warehouse_name]
        if port_file:
            cmd += ["--port-file", port_file]
        if self.prefix:
            cmd += ["--prefix", self.prefix]
        if self.credential:
            cmd += ["--credential", self.credential]
        if self.token:
            cmd += ["--token", self.token]
        if self.read_only_token:
            cmd += ["--read-only-token", self.read_only_token]
        if self.token_ttl is not None:
            cmd += ["--token-ttl", str(self.token_ttl)]
        if not self.transactions:
            cmd += ["--no-transactions"]
        for flag, kv in (("--vend", self.vend), ("--catalog-prop", self.catalog_props),
                         ("--config-default", self.config_defaults), ("--config-override", self.config_overrides)):
            for k, v in kv.items():
                cmd += [flag, f"{k}={v}"]
        return cmd

    def start(self, wait: bool = True) -> "RestCatalogServer":
        """Launches the program; with `wait=False` call `wait_ready()` later (so that several
        servers start side by side)."""
        self.db.parent.mkdir(parents=True, exist_ok=True)
        self._port_file = self.db.parent / f".rest-catalog-port-{os.getpid()}-{id(self)}"
        self._port_file.unlink(missing_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(self.command(0, str(self._port_file)), stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT)
        finally:
            log.close()
        self._deadline = time.monotonic() + self.start_timeout
        return self.wait_ready() if wait else self

    def wait_ready(self) -> "RestCatalogServer":
        """Returns once the server answers; raises with its log if it exits or times out."""
        assert self.proc is not None, "start() first"
        while True:
            if self.port is None and self._port_file.exists():
                self.port = int(self._port_file.read_text())
                self._port_file.unlink(missing_ok=True)
            if self.port is not None:
                try:
                    with urllib.request.urlopen(f"{self.uri}/_test/health", timeout=2):
                        return self
                except OSError:
                    pass
            if self.proc.poll() is not None or time.monotonic() > self._deadline:
                self.stop()
                raise RuntimeError(f"the REST catalog did not start; its log ({self.log_path}):\n{self.log_tail()}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> "RestCatalogServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    # addresses -------------------------------------------------------------------------------

    @property
    def uri(self) -> str:
        """The catalog URI clients are configured with (no /v1)."""
        assert self.port is not None, "the server is not started"
        return f"http://127.0.0.1:{self.port}"

    @property
    def token_url(self) -> str:
        return f"{self.uri}/v1/oauth/tokens"

    def url(self, route: str) -> str:
        """`route` under /v1/{prefix}/ (e.g. "namespaces/db/tables")."""
        p = f"{self.prefix.strip('/')}/" if self.prefix else ""
        return f"{self.uri}/v1/{p}{route.lstrip('/')}"

    # clients ---------------------------------------------------------------------------------

    def client(self, **props: Any):
        """PyIceberg's RestCatalog for this server, authenticated with the server's credential
        (or its static token) unless `credential=`/`token=` say otherwise."""
        if "credential" not in props and "token" not in props:
            if self.credential:
                props["credential"] = self.credential
            elif self.token:
                props["token"] = self.token
        props.setdefault("warehouse", self.warehouse_name)
        return pyiceberg_client(self.uri, **props)

    def duckdb(self, alias: str = "cat", **kw: Any):
        """A DuckDB connection with this catalog attached as `alias`, authenticated like
        `client()` (keywords as `duckdb_attach`'s)."""
        if "credential" not in kw and "token" not in kw:
            if self.credential:
                kw["credential"] = self.credential
            elif self.token:
                kw["token"] = self.token
        con = duckdb_rest_connect()
        try:
            duckdb_attach(con, self.uri, self.warehouse_name, alias, **kw)
        except BaseException:
            con.close()
            raise
        return con

    def fetch_token(self, credential: str | None = None) -> str:
        """A fresh OAuth2 access token (client credentials)."""
        cid, _, secret = (credential or self.credential or ":").partition(":")
        data = urllib.parse.urlencode({"grant_type": "client_credentials", "client_id": cid,
                                       "client_secret": secret, "scope": "catalog"}).encode()
        req = urllib.request.Request(self.token_url, data=data, method="POST",
                                     headers={"Content-Type": "application/x-www-form-urlencoded"})
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.load(r)["access_token"]

    def http(self, method: str, url: str, body: Any = None, *, token: str | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, Any]:
        """One raw request: (status, parsed JSON body or None). `url` is absolute or a route
        for `url()`. Errors are returned, not raised."""
        if not url.startswith("http"):
            url = self.url(url)
        h = dict(headers or {})
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            h.setdefault("Content-Type", "application/json")
        if token:
            h["Authorization"] = f"Bearer {token}"
        req = urllib.request.Request(url, data=data, method=method, headers=h)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                status, raw = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        return status, (json.loads(raw) if raw else None)

    # test routes -----------------------------------------------------------------------------

    def requests(self) -> list[dict]:
        """Every catalog request so far: dicts with method, path, query, authorized,
        access_delegation, status and (for commits) tables."""
        with urllib.request.urlopen(f"{self.uri}/_test/requests", timeout=10) as r:
            return json.load(r)

    def reset(self) -> None:
        """Clears the request log."""
        urllib.request.urlopen(urllib.request.Request(f"{self.uri}/_test/reset", method="POST"), timeout=10).close()

    def set_faults(self, faults: list[dict]) -> None:
        """Answers the next matching requests with errors (see the module docstring)."""
        req = urllib.request.Request(f"{self.uri}/_test/faults", data=json.dumps(faults).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=10).close()


if __name__ == "__main__":
    serve()


def s3_warehouse_props(endpoint: str, region: str) -> tuple[dict[str, str], dict[str, str]]:
    """For a catalog whose warehouse is on S3 at `endpoint` (moto): the properties the server's
    own SqlCatalog reaches it with, and the keys it vends to clients (distinct from its own, so
    a test can tell which ones a client used)."""
    server = {"s3.endpoint": endpoint, "s3.access-key-id": "testing",
              "s3.secret-access-key": "testing", "s3.region": region}
    vended = {"s3.endpoint": endpoint, "s3.access-key-id": "vended-key-id",
              "s3.secret-access-key": "vended-secret", "s3.session-token": "vended-session",
              "s3.region": region, "s3.path-style-access": "true"}
    return server, vended
