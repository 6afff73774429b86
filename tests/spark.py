"""Spark 3.5 with the Iceberg 1.10 runtime: a third independent reader of Skippr's tables.

`start_spark()` starts one local[2] SparkSession with Iceberg's SQL extensions and the runtime
jars that tests/run caches in ``$SKIPPR_SPARK_DIR`` (default ``~/.cache/skippr/spark``; see
tests/spark_jars.py for why there are two). A session takes about 10 s to its first answer (on
the 2-core machine, with the JIT held to C1) and 400 MB, so the suite shares one: the
session-scoped ``spark`` fixture in conftest.py.

Spark reads a table as `spark.read.format("iceberg").load(<metadata file>)`: the table's
current metadata file, which the warehouse's sqlite catalog names (looked up the way the
PyIceberg helpers do). Not through Iceberg's JdbcCatalog over `catalog.db` (Debian has a sqlite
JDBC driver): it leaves a metadata ResultSet open on a pooled connection, whose read lock then
blocks Skippr's next commit to `catalog.db` until Spark stops.

Only Spark's own reading is under test here: its rows come back through `collect()`, with
timestamps taken as epoch microseconds so that neither the Python process's time zone nor
pyspark's conversion can change them. `scanned_files` tells which data and delete files Spark's
scan of a (filtered) DataFrame plans to read: what pruning left.

Spark has no `time` type: a table with a `time` column cannot be read by Spark at all.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import glob
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

ICEBERG_RUNTIME = "iceberg-spark-runtime-3.5_2.12-1.10.2"


def spark_dir() -> Path:
    return Path(os.environ.get("SKIPPR_SPARK_DIR") or Path.home() / ".cache" / "skippr" / "spark")


def runtime_jars() -> list[Path]:
    """The Iceberg runtime jar and the extra jar with the classes it lacks."""
    jars = [spark_dir() / f"{ICEBERG_RUNTIME}.jar", spark_dir() / f"{ICEBERG_RUNTIME}-extra.jar"]
    missing = [str(j) for j in jars if not j.exists()]
    if missing:
        raise RuntimeError(f"Iceberg jars for Spark missing: {missing}: run tests/run (it builds them)")
    return jars


def java_home() -> str | None:
    """Spark 3.5 needs Java 17 (or 21); the machine may also have newer ones on PATH."""
    if os.environ.get("SKIPPR_SPARK_JAVA_HOME"):
        return os.environ["SKIPPR_SPARK_JAVA_HOME"]
    for version in (17, 21):
        for java in sorted(glob.glob(f"/usr/lib/jvm/java-{version}-openjdk-*/bin/java")):
            return str(Path(java).parent.parent)
    return os.environ.get("JAVA_HOME")


@dataclass
class SparkReader:
    """The shared SparkSession and what the tests ask of it."""

    session: "pyspark.sql.SparkSession"  # noqa: F821
    scratch: Path

    def stop(self) -> None:
        self.session.stop()
        shutil.rmtree(self.scratch, ignore_errors=True)

    def table(self, warehouse: Path, namespace: str, table: str):
        """The table as a DataFrame, read at its current snapshot: the metadata file the
        warehouse's catalog names now."""
        from conftest import load_iceberg_table

        return self.table_at(load_iceberg_table(warehouse, namespace, table).metadata_location)

    def table_at(self, metadata_location: str):
        """The table as one metadata file describes it."""
        return self.session.read.format("iceberg").load(metadata_location)

    def metadata_table(self, warehouse: Path, namespace: str, table: str, name: str):
        """One of Iceberg's metadata tables (`files`, `data_files`, `delete_files`, `manifests`,
        `partitions`, `snapshots`, `entries`, ...) of the table's current metadata file."""
        from conftest import load_iceberg_table

        location = load_iceberg_table(warehouse, namespace, table).metadata_location
        return self.table_at(f"{location}#{name}")

    def rows(self, df, order_by: Sequence[str] = ()) -> list[dict]:
        """`df` collected as dicts in column order, timestamps as aware (timestamptz) or naive
        (timestamp) datetimes computed from the exact epoch microseconds Spark holds."""
        from pyspark.sql import functions as F
        from pyspark.sql.types import ArrayType, TimestampNTZType, TimestampType

        # unix_micros takes a timestamp: a timestamp_ntz cast to one is read in the session's
        # time zone, UTC, so its micros are those of its wall time
        converters = {}
        columns = []
        for f in df.schema.fields:
            col = F.col(f"`{f.name}`")
            t = f.dataType
            elem = t.elementType if isinstance(t, ArrayType) else None
            if isinstance(t, (TimestampType, TimestampNTZType)):
                columns.append(F.unix_micros(col.cast("timestamp")).alias(f.name))
                converters[f.name] = _timestamp(isinstance(t, TimestampType))
            elif isinstance(elem, (TimestampType, TimestampNTZType)):
                columns.append(F.transform(col, lambda x: F.unix_micros(x.cast("timestamp"))).alias(f.name))
                convert = _timestamp(isinstance(elem, TimestampType))
                converters[f.name] = lambda v, convert=convert: [convert(x) for x in v]
            else:
                columns.append(col)
        rows = []
        for r in df.select(*columns).collect():
            d = r.asDict()
            for name, convert in converters.items():
                if d[name] is not None:
                    d[name] = convert(d[name])
            rows.append(d)
        if order_by:
            rows.sort(key=lambda r: tuple((r[c] is None, r[c]) for c in order_by))
        return rows

    def read_rows(self, warehouse: Path, namespace: str, table: str, order_by: Sequence[str] = ()) -> list[dict]:
        return self.rows(self.table(warehouse, namespace, table), order_by)

    def scanned_files(self, df) -> "ScannedFiles":
        """The data and delete files Spark's Iceberg scan plans to read for `df` (typically a
        filtered read): what is left after Spark pushed the filter down and Iceberg pruned by
        partition values and column statistics. Taken from the planned input partitions of the
        query's batch scan, so nothing is read to answer it."""
        jvm_plan = df._jdf.queryExecution().executedPlan()
        scans = _batch_scans(jvm_plan)
        if not scans:
            raise AssertionError(f"no Iceberg batch scan in the plan:\n{jvm_plan.toString()}")
        data, deletes = set(), set()
        for scan in scans:
            partitions = scan.inputPartitions()  # a Scala Seq
            for p in range(partitions.size()):
                for task in _iterate(partitions.apply(p).taskGroup().tasks()):
                    data.add(task.file().location())
                    deletes.update(d.location() for d in _iterate(task.deletes()))
        return ScannedFiles(frozenset(data), frozenset(deletes))


@dataclass(frozen=True)
class ScannedFiles:
    data: frozenset[str]
    deletes: frozenset[str]


def _batch_scans(plan) -> list:
    """Every BatchScanExec node of a physical plan (a JVM object), adaptive plans included."""
    found = []
    stack = [plan]
    while stack:
        node = stack.pop()
        name = node.getClass().getSimpleName()
        if name == "BatchScanExec":
            found.append(node)
        if name == "AdaptiveSparkPlanExec":
            stack.append(node.executedPlan())
        children = node.children()
        for i in range(children.size()):
            stack.append(children.apply(i))
    return found


def _iterate(java_collection):
    it = java_collection.iterator()
    while it.hasNext():
        yield it.next()


_EPOCH = dt.datetime(1970, 1, 1)


def _timestamp(with_zone: bool):
    def convert(micros: int) -> dt.datetime:
        value = _EPOCH + dt.timedelta(microseconds=micros)
        return value.replace(tzinfo=dt.timezone.utc) if with_zone else value
    return convert


@contextlib.contextmanager
def _environment(values: dict[str, str]):
    """`values` in os.environ for the duration, then the environment as it was."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def start_spark() -> SparkReader:
    """A local[2] SparkSession with the Iceberg runtime, on loopback, writing only to a scratch
    folder of its own."""
    jars = runtime_jars()
    from pyspark.sql import SparkSession

    # the JVM's environment, set only while pyspark launches it: the suite's other children
    # keep theirs
    launch_env = {"PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    home = java_home()
    if home:
        launch_env["JAVA_HOME"] = home
    scratch = Path(tempfile.mkdtemp(prefix="skippr-spark-"))
    with _environment(launch_env):
        session = (
            SparkSession.builder.master("local[2]")
            .appName("skippr-tests")
            .config("spark.jars", ",".join(str(j) for j in jars))
            .config("spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
            .config("spark.driver.memory", "1g")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.catalogImplementation", "in-memory")
            .config("spark.sql.warehouse.dir", str(scratch / "spark-warehouse"))
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.default.parallelism", "2")
            # C1 only: short test queries start and finish about twice as fast without C2
            .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1")
            .getOrCreate()
        )
    session.sparkContext.setLogLevel("WARN")
    return SparkReader(session, scratch)
