"""The flagship example on S3 and Glue: an `AthenaIceberg` sink with its schema sink and the
WAL in S3 (`skipprd_el_storage_mode: s3`), against a local S3 and Glue stand-in (moto's
server, started on a free port by these tests and stopped by its PID).

After the snapshot, changes, a schema change and restarts, PyIceberg's `GlueCatalog` and
DuckDB (httpfs + iceberg, reading the metadata file Glue names) must equal Postgres row by
row; the WAL must be objects in the state bucket; nothing may be written to local disk.
The commit protocol's guard against a concurrent Glue writer is unit-tested in Rust
(src/catalog/glue_tests.rs): moto does not check `VersionId`."""

from __future__ import annotations

import json
import urllib.parse

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterable

import pytest

from conftest import (
    Database,
    Skippr,
    assert_no_panic,
    assert_rows_equal,
    describe_run,
    duckdb_connect,
    duckdb_rows,
    expected_rows,
    free_port,
    pg_table_spec,
    quote_ident,
)

REGION = "us-east-1"
STATE_BUCKET = "skippr-state"
LAKE_BUCKET = "skippr-lake"
GLUE_DB = "analytics_glue"


class Moto:
    """moto's server on localhost: S3 and Glue at one endpoint."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = open(workdir / "moto.log", "w")
        # Requests are recorded (when a test starts the recorder) into this file.
        self.recording = workdir / "moto_recording"
        env = dict(os.environ, MOTO_RECORDER_FILEPATH=str(self.recording))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=2)
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    pytest.fail(f"moto server did not start; see {workdir / 'moto.log'}")
                time.sleep(0.2)

    @property
    def env(self) -> dict[str, str]:
        """What a user's shell would hold to point the AWS chain at this endpoint."""
        return {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": REGION,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_PROFILE": None,  # type: ignore[dict-item]
            "AWS_SESSION_TOKEN": None,  # type: ignore[dict-item]
        }

    def client(self, service: str):
        import boto3

        return boto3.client(
            service, endpoint_url=self.endpoint, region_name=REGION,
            aws_access_key_id="testing", aws_secret_access_key="testing",
        )

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        out: list[str] = []
        pages = self.client("s3").get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for page in pages:
            out += [o["Key"] for o in page.get("Contents", [])]
        return out

    def record(self, on: bool) -> None:
        """Starts (after clearing) or stops moto's request recorder."""
        what = "reset-recording" if on else "stop-recording"
        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/moto-api/recorder/{what}", method="POST"), timeout=10)
        if on:
            urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/moto-api/recorder/start-recording", method="POST"), timeout=10)

    def recorded(self) -> list[dict]:
        """The requests recorded since `record(True)`."""
        if not self.recording.exists():
            return []
        # moto's threads append records without a lock: two may share a line, so the file is
        # read as a stream of JSON documents rather than one per line.
        text, decoder, out, at = self.recording.read_text(), json.JSONDecoder(), [], 0
        while True:
            while at < len(text) and text[at].isspace():
                at += 1
            if at >= len(text):
                return out
            doc, at = decoder.raw_decode(text, at)
            out.append(doc)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


@pytest.fixture
def moto(workdir: Path) -> Iterable[Moto]:
    server = Moto(workdir.parent)
    try:
        s3 = server.client("s3")
        for bucket in (STATE_BUCKET, LAKE_BUCKET):
            s3.create_bucket(Bucket=bucket)
        yield server
    finally:
        server.stop()


def flagship_config(skippr: Skippr, tables: list[str], commit_interval: str = "10s", pipeline_extra: str = "") -> None:
    """docs/config.md's whole example, pointed at the test database and moto."""
    db = skippr.db
    athena = (
        f"      warehouse: s3://{LAKE_BUCKET}/warehouse/\n"
        f"      glue_database_name: {GLUE_DB}\n"
        "      athena_workgroup_name: primary\n"
        "      athena_results_s3_bucket: skippr-athena-results\n"
        f"      region: {REGION}\n"
    )
    skippr.env["APP_DB_PASSWORD"] = "skippr"
    skippr.write_raw_config(
        "skippr:\n"
        "  workspace: analytics\n"
        "  skipprd_el_storage_mode: s3\n"
        f"  skipprd_el_storage_path: s3://{STATE_BUCKET}/skippr\n"
        "\n"
        "pipelines:\n"
        "  app:\n"
        "    data_source: data_sources.app_db\n"
        "    data_sink: data_sinks.lake\n"
        f"    commit_interval: {commit_interval}\n"
        f"{pipeline_extra}"
        "\n"
        "data_sources:\n"
        "  app_db:\n"
        "    Postgres:\n"
        f"      host: {db.host}\n"
        f"      port: {db.port}\n"
        "      user: skippr\n"
        "      password: ${APP_DB_PASSWORD}\n"
        f"      database: {db.name}\n"
        f"      tables: [{', '.join(tables)}]\n"
        "      cdc_mode: snapshot_then_cdc\n"
        "\n"
        "data_sinks:\n"
        "  lake:\n"
        "    AthenaIceberg:\n"
        f"{athena}"
        "    schema_sink: schema_sinks.lake_schema\n"
        "\n"
        "schema_sinks:\n"
        "  lake_schema:\n"
        "    AthenaIceberg:\n"
        f"{athena}"
    )


def glue_catalog(moto: Moto):
    from pyiceberg.catalog.glue import GlueCatalog

    return GlueCatalog(
        "glue",
        **{
            "glue.endpoint": moto.endpoint,
            "glue.region": REGION,
            "glue.access-key-id": "testing",
            "glue.secret-access-key": "testing",
            "s3.endpoint": moto.endpoint,
            "s3.region": REGION,
            "s3.access-key-id": "testing",
            "s3.secret-access-key": "testing",
        },
    )


def read_glue_pyiceberg(moto: Moto, table: str, order_by: list[str]) -> list[dict]:
    rows = glue_catalog(moto).load_table((GLUE_DB, table)).scan().to_arrow().to_pylist()
    rows.sort(key=lambda r: tuple((r[c] is None, r[c]) for c in order_by))
    return rows


def read_glue_duckdb(moto: Moto, table: str, order_by: list[str]) -> list[dict]:
    """DuckDB reads the metadata file that Glue names, over S3 with httpfs."""
    location = moto.client("glue").get_table(DatabaseName=GLUE_DB, Name=table)["Table"]["Parameters"]["metadata_location"]
    con = duckdb_connect()
    try:
        import glob

        import duckdb_extension_httpfs  # noqa: F401  (the wheel ships the extension file)

        base = os.path.dirname(duckdb_extension_httpfs.__file__)
        found = glob.glob(f"{base}/**/httpfs.duckdb_extension", recursive=True)
        assert found, f"httpfs.duckdb_extension not found under {base}"
        con.execute(f"LOAD '{found[0]}'")
        host = moto.endpoint.removeprefix("http://")
        con.execute(
            "CREATE SECRET moto (TYPE S3, KEY_ID 'testing', SECRET 'testing', "
            f"REGION '{REGION}', ENDPOINT '{host}', URL_STYLE 'path', USE_SSL false)"
        )
        order = ", ".join(quote_ident(c) for c in order_by)
        return duckdb_rows(con, f"SELECT * FROM iceberg_scan('{location}') ORDER BY {order}")
    finally:
        con.close()


def assert_matches(skippr: Skippr, moto: Moto, table: str) -> None:
    spec = pg_table_spec(skippr.db, table)
    expected = expected_rows(skippr.db, spec)
    assert_rows_equal(expected, skippr.read_query(spec), spec, "skipprd query (Glue + S3)")
    assert_rows_equal(expected, read_glue_pyiceberg(moto, spec.iceberg_name, spec.primary_key), spec, "pyiceberg (Glue)")
    assert_rows_equal(expected, read_glue_duckdb(moto, spec.iceberg_name, spec.primary_key), spec, "duckdb (httpfs)")


def local_files(workdir: Path) -> list[str]:
    """Everything skipprd could have written beside skippr.yml (logs of the test aside)."""
    return sorted(
        str(p.relative_to(workdir)) for p in workdir.rglob("*")
        if p.name not in ("skippr.yml", "bg.stdout", "bg.stderr")
    )


def setup_tables(db: Database) -> None:
    db.execute(
        "CREATE TABLE orders (id bigint PRIMARY KEY, customer_id int NOT NULL, amount numeric(12,2), "
        "note text, placed_at timestamptz NOT NULL DEFAULT now())"
    )
    db.execute("CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL, vip boolean)")
    db.execute(
        "INSERT INTO orders (id, customer_id, amount, note) "
        "SELECT g, g % 17, g * 1.25, CASE WHEN g % 3 = 0 THEN NULL ELSE 'n' || g END "
        "FROM generate_series(1, 2000) g"
    )
    db.execute("INSERT INTO customers SELECT g, 'c' || g, g % 2 = 0 FROM generate_series(1, 40) g")


def test_flagship_example_on_s3_and_glue(skippr: Skippr, moto: Moto) -> None:
    db = skippr.db
    setup_tables(db)
    flagship_config(skippr, ["orders", "customers"])
    skippr.env.update(moto.env)
    proc = skippr.run("validate")
    assert "AthenaIceberg" in proc.stdout, describe_run(proc)

    # Snapshot.
    skippr.sync_once()
    glue = moto.client("glue")
    t = glue.get_table(DatabaseName=GLUE_DB, Name="orders")["Table"]
    assert t["Parameters"]["table_type"] == "ICEBERG"
    assert t["Parameters"]["metadata_location"].startswith(f"s3://{LAKE_BUCKET}/warehouse/{GLUE_DB}.db/orders/metadata/")
    columns = [(c["Name"], c["Type"]) for c in t["StorageDescriptor"]["Columns"]]
    assert columns[:4] == [("id", "bigint"), ("customer_id", "int"), ("amount", "decimal(12,2)"), ("note", "string")]
    for table in ("orders", "customers"):
        assert_matches(skippr, moto, table)

    # Changes: inserts, updates (also of a key), deletes, in a few transactions.
    db.execute("INSERT INTO orders (id, customer_id, amount, note) SELECT g, 1, 9.99, 'new' FROM generate_series(2001, 2100) g")
    db.execute("UPDATE orders SET amount = amount + 1, note = 'upd' WHERE id % 10 = 0")
    db.execute("UPDATE orders SET id = id + 100000 WHERE id BETWEEN 50 AND 60")
    db.execute("DELETE FROM orders WHERE id % 7 = 0")
    db.execute("UPDATE customers SET vip = NOT vip WHERE id < 10")
    db.execute("DELETE FROM customers WHERE id = 40")
    skippr.sync_once()
    before = t["Parameters"]["metadata_location"]
    t = glue.get_table(DatabaseName=GLUE_DB, Name="orders")["Table"]
    assert t["Parameters"]["previous_metadata_location"] != t["Parameters"]["metadata_location"]
    assert t["Parameters"]["metadata_location"] != before
    for table in ("orders", "customers"):
        assert_matches(skippr, moto, table)

    # Schema change: a new column, then rows that use it; Glue shows the column.
    db.execute("ALTER TABLE customers ADD COLUMN tier text")
    db.execute("INSERT INTO customers VALUES (41, 'c41', true, 'gold')")
    db.execute("UPDATE customers SET tier = 'silver' WHERE id = 2")
    skippr.sync_once()
    columns = [c["Name"] for c in glue.get_table(DatabaseName=GLUE_DB, Name="customers")["Table"]["StorageDescriptor"]["Columns"]]
    assert columns == ["id", "name", "vip", "tier"]
    for table in ("orders", "customers"):
        assert_matches(skippr, moto, table)

    # Nothing on local disk: no warehouse, no catalog, no WAL folder.
    assert local_files(skippr.workdir) == []
    # Everything committed: the WAL holds no segment any more.
    assert [k for k in moto.keys(STATE_BUCKET, "skippr/wal/app/") if k.endswith(".seg")] == []


def test_wal_is_in_s3_and_survives_a_restart(skippr: Skippr, moto: Moto) -> None:
    """A continuous sync with a long commit interval makes changes durable as WAL objects
    in S3 only; stopped before it commits them, the next run commits them from S3."""
    db = skippr.db
    setup_tables(db)
    flagship_config(skippr, ["orders", "customers"], commit_interval="10m")
    skippr.env.update(moto.env)
    skippr.sync_once()

    proc = skippr.start("sync", "--pipeline", "app")
    try:
        db.execute("INSERT INTO orders (id, customer_id, amount) SELECT g, 2, 1.5 FROM generate_series(5001, 5050) g")
        db.execute("DELETE FROM customers WHERE id <= 5")
        deadline = time.monotonic() + 60
        segments: list[str] = []
        while time.monotonic() < deadline and not segments:
            segments = [k for k in moto.keys(STATE_BUCKET, "skippr/wal/app/") if k.endswith(".seg")]
            time.sleep(0.3)
        assert segments, "no WAL segment appeared in S3 within 60 s:\n" + (skippr.workdir / "bg.stderr").read_text()[-4000:]
        # Not committed yet: Iceberg still shows the snapshot, while `skipprd query` sees
        # the changes from the WAL tail in S3.
        spec = pg_table_spec(db, "orders")
        assert len(read_glue_pyiceberg(moto, "orders", spec.primary_key)) == 2000
        expected = expected_rows(db, spec)
        deadline = time.monotonic() + 60
        live = skippr.read_query(spec)
        while len(live) != len(expected) and time.monotonic() < deadline:
            time.sleep(0.5)
            live = skippr.read_query(spec)
        assert_rows_equal(expected, live, spec, "skipprd query (WAL tail in S3)")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    stderr = (skippr.workdir / "bg.stderr").read_text()
    assert "panicked" not in stderr, stderr[-4000:]

    # The restart commits what the WAL in S3 holds (and what the slot still has).
    skippr.sync_once()
    for table in ("orders", "customers"):
        assert_matches(skippr, moto, table)
    assert local_files(skippr.workdir) == []


def test_a_transaction_larger_than_memory_goes_through_s3_in_parts(skippr: Skippr, moto: Moto) -> None:
    """With a 1 MiB transaction budget, an 80 MiB transaction is spilled locally while it
    streams, uploaded to the WAL in S3 as a multipart upload, read back in ranges, applied
    change by change and committed once; the peak memory of the sync stays far below the
    transaction's size."""
    db = skippr.db
    setup_tables(db)
    flagship_config(skippr, ["orders"], pipeline_extra="    transaction_memory_budget_mb: 1\n")
    skippr.env.update(moto.env)
    skippr.sync_once()
    db.execute("INSERT INTO orders (id, customer_id, amount) VALUES (1000000, 1, 1)")
    small = skippr.run("--log-format", "json", "sync", "--pipeline", "app", "--once")
    rows, width = 20_000, 4_000
    with db.connect() as conn:
        with conn.transaction():
            conn.execute(
                f"INSERT INTO orders (id, customer_id, amount, note) "
                f"SELECT g, g % 17, g, repeat(md5(g::text), {width // 32}) FROM generate_series(3000, {2999 + rows}) g")
            conn.execute("UPDATE orders SET note = 'short' WHERE id % 10 = 0")
            conn.execute("DELETE FROM orders WHERE id % 13 = 0")
    big = skippr.run("--log-format", "json", "sync", "--pipeline", "app", "--once")
    assert "spilling" in big.stderr, describe_run(big, "the transaction did not spill")
    assert_matches(skippr, moto, "orders")
    assert local_files(skippr.workdir) == []

    def peak(run) -> int:
        lines = [json.loads(l) for l in run.stderr.splitlines() if '"peak_rss_mib"' in l]
        assert lines, describe_run(run, "no peak_rss_mib reported")
        return int(lines[-1]["fields"]["peak_rss_mib"])

    # The parts of the transaction are compacted right after; parts of disjoint key ranges are
    # read one after the other, not all at once.
    compactions = [json.loads(l)["fields"] for l in big.stderr.splitlines() if '"compacted"' in l]
    assert compactions, describe_run(big, "the transaction's parts were not compacted")
    assert all(c["files_read_at_once"] <= 3 < c["files_in"] for c in compactions), compactions

    size_mb = rows * width // (1024 * 1024)
    added = peak(big) - peak(small)
    print(f"a {size_mb} MiB transaction through S3 added {added} MiB of peak RSS over a small one")
    assert added < size_mb, f"a {size_mb} MiB transaction through S3 took {added} MiB more memory than a small one"


def test_storage_errors_name_the_problem(skippr: Skippr, moto: Moto) -> None:
    """A missing state bucket stops the sync with a message naming the bucket; nothing panics."""
    db = skippr.db
    setup_tables(db)
    flagship_config(skippr, ["customers"])
    skippr.env.update(moto.env)
    text = skippr.config_path.read_text().replace(f"s3://{STATE_BUCKET}/skippr", "s3://no-such-bucket-x/skippr")
    skippr.write_raw_config(text)
    db.execute("INSERT INTO customers VALUES (100, 'x', true)")
    proc = skippr.run("sync", "--pipeline", "app", "--once", check=False)
    assert_no_panic(proc)
    # The snapshot commits to Glue; the WAL write to the missing bucket must stop the run.
    db.execute("INSERT INTO customers VALUES (101, 'y', false)")
    proc = skippr.run("sync", "--pipeline", "app", "--once", check=False)
    assert_no_panic(proc)
    assert proc.returncode != 0, describe_run(proc)
    assert "no-such-bucket-x" in proc.stderr, describe_run(proc)


def _is_wal_listing(r: dict) -> bool:
    return r["method"] == "GET" and "list-type=2" in r["url"] and "wal" in urllib.parse.unquote(r["url"])


def _is_glue(r: dict, action: str) -> bool:
    target = {k.lower(): v for k, v in r["headers"].items()}.get("x-amz-target", "")
    return target.endswith(f".{action}")


def test_serve_reads_its_own_writes_on_s3_without_a_request_per_statement(skippr: Skippr, moto: Moto) -> None:
    """`serve` holding the pipeline's lease knows the WAL segments it wrote and the metadata it
    committed: its queries see every change at once (read back here, row by row) and a warm
    statement sends neither a WAL listing to S3 nor a GetTable to Glue. Table maintenance
    runs over S3 too: compaction, expiry and orphan cleanup, and Glue readers stay equal."""
    import psycopg

    db = skippr.db
    db.execute("CREATE TABLE orders (id bigint PRIMARY KEY, amount numeric(12,2), note text)")
    db.execute("INSERT INTO orders SELECT g, g * 0.5, 'o' || g FROM generate_series(1, 500) g")
    maintenance = (
        "    maintenance:\n"
        "      check_interval: 500ms\n"
        "      snapshot_retention: 2s\n"
        "      min_snapshots_to_keep: 2\n"
        "      orphan_file_age: 2s\n"
        "      compaction_min_files: 3\n"
    )
    flagship_config(skippr, ["orders"], commit_interval="300ms", pipeline_extra=maintenance)
    port = free_port()
    text = skippr.config_path.read_text().replace(
        "\npipelines:\n", f"  query:\n    listen: 127.0.0.1:{port}\n\npipelines:\n", 1
    )
    skippr.config_path.write_text(text)
    skippr.env.update(moto.env)
    proc = skippr.start("serve")
    log = skippr.workdir / "bg.stderr"

    def connect() -> psycopg.Connection:
        return psycopg.connect(host="127.0.0.1", port=port, dbname="analytics", user="skippr",
                               autocommit=True, connect_timeout=10)

    def scalar(conn: psycopg.Connection, sql: str, params: tuple = ()) -> object:
        row = conn.execute(sql, params).fetchone()
        assert row is not None
        return row[0]

    try:
        deadline = time.monotonic() + 120
        conn = None
        while conn is None:
            assert proc.poll() is None, log.read_text()[-4000:]
            try:
                conn = connect()
                if scalar(conn, "SELECT count(*) FROM orders") != 500:
                    conn.close()
                    conn = None
            except psycopg.Error:
                conn = None
            if conn is None:
                assert time.monotonic() < deadline, "serve did not answer within 120 s:\n" + log.read_text()[-4000:]
                time.sleep(0.3)
        with conn:
            # Every change is read back through the gateway as soon as Postgres has it.
            for i in range(30):
                key = 10_000 + i
                db.execute("INSERT INTO orders VALUES (%s, %s, 'fresh')", (key, i))
                db.execute("UPDATE orders SET note = 'seen' || %s WHERE id = %s", (str(i), i + 1))
                db.execute("DELETE FROM orders WHERE id = %s", (400 + i,))
                until = time.monotonic() + 30
                while True:
                    got = (
                        scalar(conn, "SELECT count(*) FROM orders WHERE id = %s", (key,)),
                        scalar(conn, "SELECT max(note) FROM orders WHERE id = %s", (i + 1,)),
                        scalar(conn, "SELECT count(*) FROM orders WHERE id = %s", (400 + i,)),
                    )
                    if got == (1, f"seen{i}", 0):
                        break
                    assert time.monotonic() < until, f"change {i} not visible within 30 s: {got}\n" + log.read_text()[-3000:]
                    time.sleep(0.05)
            # Wait for the maintenance the changes made due (30 commits, 3 files per compaction).
            until = time.monotonic() + 60
            while scalar(conn, "SELECT last_compaction_time FROM skippr.tables WHERE table_name = 'orders'") is None:
                assert time.monotonic() < until, "no compaction over S3 within 60 s:\n" + log.read_text()[-3000:]
                time.sleep(0.3)
            expected = db.execute("SELECT count(*), sum(amount) FROM orders")[0]
            # Warm statements: no WAL listing and no Glue lookup per statement.
            moto.record(True)
            started = time.monotonic()
            statements = 100
            for _ in range(statements):
                assert conn.execute("SELECT count(*), sum(amount) FROM orders").fetchone() == expected
            elapsed = time.monotonic() - started
            moto.record(False)
        requests = moto.recorded()
        listings = [r for r in requests if _is_wal_listing(r)]
        lookups = [r for r in requests if _is_glue(r, "GetTable")]
        # Without the view each statement lists the WAL and asks Glue (100 of each); what
        # remains is the pipeline's own work: a listing per apply round, a GetTable after
        # each of its commits and maintenance commits.
        allowed = statements // 10 + int(elapsed / 0.3)
        assert len(listings) <= allowed, f"{len(listings)} WAL listings for {statements} statements in {elapsed:.1f}s"
        assert len(lookups) <= allowed, f"{len(lookups)} Glue GetTable for {statements} statements in {elapsed:.1f}s"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    stderr = log.read_text()
    assert "panicked" not in stderr, stderr[-4000:]
    assert "table maintenance failed" not in stderr, stderr[-4000:]
    assert proc.returncode == 0, stderr[-4000:]
    assert_matches(skippr, moto, "orders")
    # Compaction left one data manifest (its snapshot is current when nothing changed since).
    table = glue_catalog(moto).load_table((GLUE_DB, "orders"))
    snap = table.current_snapshot()
    assert snap is not None
    # Expiry ran over S3: the first commits are gone and what remains is the retention window
    # (2 s at a commit per 300 ms) plus what was committed since the last maintenance pass.
    sequence = sorted(s.sequence_number for s in table.metadata.snapshots)
    assert sequence[0] > 1, sequence
    assert len(sequence) <= 20 < table.metadata.last_sequence_number, (sequence, table.metadata.last_sequence_number)
    # Everything the table references is in the bucket.
    keys = set(moto.keys(LAKE_BUCKET, "warehouse/"))
    for task in table.scan().plan_files():
        for f in [task.file, *task.delete_files]:
            assert f.file_path.removeprefix(f"s3://{LAKE_BUCKET}/") in keys, f.file_path


def test_serve_asks_glue_once_for_a_table_it_has_not_written_yet(skippr: Skippr, moto: Moto) -> None:
    """A `serve` that took the lease over tables another run committed (nothing has changed
    since, so it commits nothing itself) asks Glue where each table points once, then
    trusts that while it holds the lease: warm statements send no GetTable."""
    import psycopg

    db = skippr.db
    db.execute("CREATE TABLE orders (id bigint PRIMARY KEY, amount numeric(12,2))")
    db.execute("INSERT INTO orders SELECT g, g * 0.5 FROM generate_series(1, 300) g")
    flagship_config(skippr, ["orders"], commit_interval="300ms")
    skippr.env.update(moto.env)
    skippr.sync_once()
    port = free_port()
    text = skippr.config_path.read_text().replace(
        "\npipelines:\n", f"  query:\n    listen: 127.0.0.1:{port}\n\npipelines:\n", 1
    )
    skippr.config_path.write_text(text)
    proc = skippr.start("serve")
    log = skippr.workdir / "bg.stderr"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log.read_text()[-4000:]
            try:
                conn = psycopg.connect(host="127.0.0.1", port=port, dbname="analytics", user="skippr",
                                       autocommit=True, connect_timeout=10)
                break
            except psycopg.Error:
                assert time.monotonic() < deadline, "serve did not answer within 120 s:\n" + log.read_text()[-4000:]
                time.sleep(0.3)
        with conn:
            # The lease is taken once the pipeline runs; then a statement reads Glue once.
            until = time.monotonic() + 60
            while "pipeline lease taken" not in log.read_text():
                assert time.monotonic() < until, log.read_text()[-3000:]
                time.sleep(0.2)
            assert conn.execute("SELECT count(*), sum(amount) FROM orders").fetchone()[0] == 300
            time.sleep(1)
            assert conn.execute("SELECT count(*) FROM orders").fetchone() == (300,)
            moto.record(True)
            for _ in range(50):
                assert conn.execute("SELECT count(*) FROM orders WHERE id <= 100").fetchone() == (100,)
            moto.record(False)
        lookups = [r for r in moto.recorded() if _is_glue(r, "GetTable")]
        assert len(lookups) <= 2, f"{len(lookups)} Glue GetTable for 50 statements"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, log.read_text()[-4000:]
