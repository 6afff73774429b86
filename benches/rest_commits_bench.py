"""REST catalog commit latency driver (see rest_commits.sh): the `commit round`s of a continuous
`skipprd sync` into a `RestIceberg` sink, per round, for 1 table and for TABLES_MAX tables.

Per table count N (1 and TABLES_MAX, default 10), and per run (RUNS):
1. A fresh source database with N tables `t01`..`tNN` (bigint key, numeric, text,
   timestamptz; SEED rows each).
2. For each sink: `local` (LocalIceberg, its sqlite catalog), `rest-tx` (RestIceberg on the
   suite's loopback REST catalog, tests/rest_catalog.py, which offers
   `POST /v1/transactions/commit`: a round of N tables is one request) and `rest-notx` (the
   same server started with `--no-transactions`: one commit request per table), each in its
   own workspace (own slot, own tables): `skipprd sync` (continuous, `commit_interval:
   COMMIT_INTERVAL`, maintenance disabled, `RUST_LOG=skippr=debug`) while one writer commits
   RATE transactions/s, each inserting one row into every one of the N tables, until WARMUP +
   ROUNDS `commit round` lines with `tables = N` are logged. The first WARMUP rounds (the
   snapshot's tail, table creation, a first token) are dropped; of the next ROUNDS:
   - `round_ms` (data files, manifests, catalog request(s): the whole round) p50/p99;
   - `catalog_ms` (the `transactions/commit` request as skipprd sees it; 0 without one) p50/p99;
   - the REST catalog's own time for the commit requests of each round (from its request log:
     `POST ... -> 200 (N ms)`; commit requests come only from commit rounds, in order, so
     they are matched to the rounds from the last one back, one per round with
     `in_one_request`, one per table without, each checked against the round's span),
     summed per round, p50/p99, and the requests of any kind per round;
   - the peak RSS of skipprd (`peak_rss_mib` of its "sync finished" line, and ru_maxrss).
3. Baseline, in the same run: PyIceberg's `RestCatalog` (the client most people script
   against a REST catalog) against the same transactions-capable server, on N fresh tables of
   the same columns: WARMUP + ROUNDS rounds of `Table.append` of a batch of RATE *
   COMMIT_INTERVAL rows (the rows a Skippr round gets per table) to each of the N tables in
   turn (PyIceberg has no multi-table commit), a round every COMMIT_INTERVAL. p50/p99 of one
   append, of the N appends of a round, and of the catalog's own time for them.
The report adds the p50 of the first and of the last 20 measured rounds (maintenance is off,
so every commit adds a snapshot that stays: what a growing history costs).

The catalog server runs with TCP_NODELAY (see NODELAY_SERVER); CATALOG_NODELAY=0 runs
tests/rest_catalog.py exactly as the suite does. Skippr, Postgres, the catalog server and
PyIceberg share the machine's cores. Parameters (environment, defaults): ROUNDS=120 WARMUP=5
RATE=50 TABLES_MAX=10 SEED=1000 RUNS=1 COMMIT_INTERVAL=200ms CATALOG_NODELAY=1.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from decimal import Decimal
from pathlib import Path

import psycopg

from benchlib import (binary_kind, binary_time, command_line, machine, pct, pg_connect, recreate_database_on, source_version,
                      tail)

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

P = {k: int(os.environ.get(k, v)) for k, v in {
    "ROUNDS": 120, "WARMUP": 5, "RATE": 50, "TABLES_MAX": 10, "SEED": 1000, "RUNS": 1,
}.items()}
COMMIT_INTERVAL = os.environ.get("COMMIT_INTERVAL", "200ms")
CATALOG_NODELAY = os.environ.get("CATALOG_NODELAY", "1") != "0"
BIN = os.environ["SKIPPRD"]
WORK = Path(os.environ["BENCH_WORK"])
PG_PORT = int(os.environ["BENCH_PG_PORT"])
DB = "bench_rest"
CREDENTIAL = "bench-client:bench-secret"
SINKS = ("local", "rest-tx", "rest-notx")
LOG_FILTER = "skippr=debug,skipprd=info,pgwire_replication=off,warn"


def log(msg: str) -> None:
    print(f"[rest-commits {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def interval_s(text: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s)", text.strip())
    if not m:
        raise SystemExit(f"COMMIT_INTERVAL must look like 200ms or 1s, not {text!r}")
    return float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)


ROWS_PER_ROUND = max(1, round(P["RATE"] * interval_s(COMMIT_INTERVAL)))


def pg(dbname: str = DB) -> psycopg.Connection:
    return pg_connect(PG_PORT, dbname)


def table_names(n: int) -> list[str]:
    return [f"t{i:02d}" for i in range(1, n + 1)]


# --------------------------------------------------------------------------------------------
# The REST catalog server (tests/rest_catalog.py), its request log timestamped on arrival
# --------------------------------------------------------------------------------------------

#: tests/rest_catalog.py with TCP_NODELAY on its connections. Its handler writes an answer's
#: headers and its body in two sends on a keep-alive connection: with Nagle's algorithm on, the
#: body waits for the client's (delayed) ACK of the headers, up to 40 ms on Linux, whenever
#: requests follow each other closely (a round committed table by table, PyIceberg's appends).
#: That is the test server's, not a catalog's cost; CATALOG_NODELAY=0 measures it as it is.
NODELAY_SERVER = (f"import sys; sys.path.insert(0, {str(REPO / 'tests')!r}); import rest_catalog as rc; "
                  "rc.Handler.disable_nagle_algorithm = True; rc.serve(sys.argv[1:])")

REQUEST_LINE = re.compile(r"^(GET|HEAD|POST|PUT|DELETE) (\S+) -> (\d+) \((\d+) ms\)$")


class Catalog:
    def __init__(self, name: str, transactions: bool) -> None:
        self.name = name
        self.warehouse = WORK / f"catalog-{name}"
        self.warehouse.mkdir(parents=True)
        port_file = WORK / f"catalog-{name}.port"
        self.logfile = WORK / f"catalog-{name}.log"
        #: (arrival epoch seconds, method, path, status, server ms)
        self.requests: list[tuple[float, str, str, int, int]] = []
        self.lock = threading.Lock()
        args = ["--port", "0", "--port-file", str(port_file), "--warehouse", str(self.warehouse),
                "--credential", CREDENTIAL]
        if CATALOG_NODELAY:
            cmd = [sys.executable, "-c", NODELAY_SERVER, *args]
        else:
            cmd = [sys.executable, str(REPO / "tests" / "rest_catalog.py"), *args]
        if not transactions:
            cmd.append("--no-transactions")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                     text=True, bufsize=1)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        deadline = time.monotonic() + 60
        while not port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the REST catalog {name} did not start\n{tail(self.logfile)}")
            time.sleep(0.1)
        self.uri = f"http://127.0.0.1:{port_file.read_text().strip()}"
        log(f"REST catalog {name} on {self.uri} (transactions {'on' if transactions else 'off'}, "
            f"TCP_NODELAY {'on' if CATALOG_NODELAY else 'off'})")

    def _read(self) -> None:
        with open(self.logfile, "w") as out:
            for line in self.proc.stderr:
                now = time.time()
                out.write(line)
                out.flush()
                m = REQUEST_LINE.match(line.strip())
                if m:
                    with self.lock:
                        self.requests.append((now, m.group(1), m.group(2), int(m.group(3)), int(m.group(4))))

    def since(self, t0: float) -> list[tuple[float, str, str, int, int]]:
        with self.lock:
            return [r for r in self.requests if r[0] >= t0]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def is_commit(method: str, path: str) -> bool:
    return method == "POST" and (path.endswith("/transactions/commit") or
                                 re.search(r"/namespaces/[^/]+/tables/[^/]+$", path) is not None)


# --------------------------------------------------------------------------------------------
# The source and its write load
# --------------------------------------------------------------------------------------------


def recreate_source(n: int) -> None:
    with pg("postgres") as conn:
        recreate_database_on(conn, DB)
    with pg() as conn:
        for t in table_names(n):
            conn.execute(f"""
                CREATE TABLE {t} (id bigint PRIMARY KEY, amount numeric(12,2) NOT NULL, note text,
                                  at timestamptz NOT NULL DEFAULT now());
                INSERT INTO {t} SELECT i, i / 100.0, 'seed ' || i, timestamptz '2026-01-01' + i * interval '1 minute'
                FROM generate_series(1, {P['SEED']}) i""")


class Load:
    """One connection committing RATE transactions/s, each inserting one row into every table."""

    def __init__(self, n: int) -> None:
        self.tables = table_names(n)
        self.stopping = threading.Event()
        self.count = 0
        self.error: str | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "Load":
        self.thread.start()
        return self

    def stop(self) -> int:
        """Stops the writer; the transactions it committed (see `error` for a failure)."""
        self.stopping.set()
        self.thread.join(timeout=30)
        return self.count

    def _run(self) -> None:
        rng = random.Random(7)
        next_id = P["SEED"] + 1
        try:
            with pg() as conn:
                next_at = time.monotonic()
                while not self.stopping.is_set():
                    amount = Decimal(rng.randint(0, 100000)) / 100
                    stmts = "".join(f"INSERT INTO {t} (id, amount, note) VALUES ({next_id}, {amount}, 'row {next_id}');"
                                    for t in self.tables)
                    conn.execute(f"BEGIN;{stmts}COMMIT")
                    next_id += 1
                    self.count += 1
                    next_at += 1 / P["RATE"]
                    delay = next_at - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                    elif delay < -1:
                        next_at = time.monotonic()
        except Exception as e:  # noqa: BLE001 - reported by stop()
            self.error = f"{type(e).__name__}: {e}"


# --------------------------------------------------------------------------------------------
# skipprd sync
# --------------------------------------------------------------------------------------------


def write_config(folder: Path, ws: str, n: int, sink: str, catalog: Catalog | None) -> Path:
    if sink == "local":
        sink_yaml = "    LocalIceberg:\n      warehouse: ./warehouse\n"
    else:
        sink_yaml = f"    RestIceberg:\n      uri: {catalog.uri}\n      warehouse: wh\n      credential: {CREDENTIAL}\n"
    path = folder / "skippr.yml"
    path.write_text(
        f"skippr:\n  workspace: {ws}\n"
        "pipelines:\n  app:\n    data_source: data_sources.src\n    data_sink: data_sinks.lake\n"
        f"    commit_interval: {COMMIT_INTERVAL}\n    maintenance:\n      enabled: false\n"
        "data_sources:\n  src:\n    Postgres:\n"
        f"      host: 127.0.0.1\n      port: {PG_PORT}\n      user: postgres\n      database: {DB}\n"
        f"      tables: [{', '.join(table_names(n))}]\n"
        "data_sinks:\n  lake:\n" + sink_yaml)
    return path


def parse_ts(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def rounds_in(logfile: Path) -> list[dict]:
    """The `commit round` events of a JSON log: fields plus `end` (epoch seconds)."""
    out = []
    try:
        lines = logfile.read_text(errors="replace").splitlines()
    except OSError:
        return out
    for line in lines:
        if '"commit round"' not in line:
            continue
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being written
        f = ev.get("fields", {})
        if f.get("message") == "commit round":
            out.append({**f, "end": parse_ts(ev["timestamp"])})
    return out


def run_skippr(sink: str, n: int, run: int, catalog: Catalog | None) -> dict:
    ws = f"rc_{sink.replace('-', '_')}_{n}_r{run}"
    folder = WORK / ws
    folder.mkdir(parents=True)
    recreate_source(n)
    cfg = write_config(folder, ws, n, sink, catalog)
    logfile = folder / "sync.log"
    want = P["WARMUP"] + P["ROUNDS"]
    with open(logfile, "w") as out:
        proc = subprocess.Popen([BIN, "--config", str(cfg), "--log-format", "json", "sync", "--pipeline", "app"],
                                cwd=folder, env={**os.environ, "RUST_LOG": LOG_FILTER},
                                stdout=subprocess.DEVNULL, stderr=out, stdin=subprocess.DEVNULL)
    (WORK / "sync.pid").write_text(f"{proc.pid}\n")
    load = Load(n).start()
    t0 = time.time()
    deadline = time.monotonic() + 60 + want * 5
    rss_kib, rc = 0, None
    try:
        while True:
            full = [r for r in rounds_in(logfile) if r["tables"] == n]
            if len(full) >= want:
                break
            if proc.poll() is not None:
                raise SystemExit(f"skipprd sync ({ws}) exited with {proc.returncode}\n{tail(logfile)}")
            if time.monotonic() > deadline:
                raise SystemExit(f"skipprd sync ({ws}): {len(full)} of {want} rounds after the deadline\n{tail(logfile)}")
            time.sleep(0.5)
    finally:
        txs = load.stop()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 120
        while rc is None:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                rc, rss_kib = os.waitstatus_to_exitcode(status), usage.ru_maxrss
                proc.returncode = rc
            elif time.monotonic() > deadline:
                proc.kill()
                deadline = float("inf")
            else:
                time.sleep(0.05)
    if load.error:
        raise SystemExit(f"the write load failed: {load.error}")
    if rc != 0:
        raise SystemExit(f"skipprd sync ({ws}) exited with {rc} after SIGTERM\n{tail(logfile)}")
    all_rounds = rounds_in(logfile)
    full = [r for r in all_rounds if r["tables"] == n]
    measured = full[P["WARMUP"]:want]
    if any(r["in_one_request"] != (n if sink == "rest-tx" else 0) for r in measured):
        raise SystemExit(f"{ws}: in_one_request is not {n if sink == 'rest-tx' else 0} in every round")
    peaks = [json.loads(line)["fields"]["peak_rss_mib"] for line in logfile.read_text().splitlines()
             if '"peak_rss_mib"' in line]
    res = {
        "round_ms": [r["round_ms"] for r in measured],
        "catalog_ms": [r["catalog_ms"] for r in measured],
        "partial_rounds": len([r for r in all_rounds if r["tables"] != n]),
        "peak_mib": int(peaks[-1]) if peaks else rss_kib // 1024,
        "maxrss_mib": rss_kib // 1024,
        "txs": txs,
        "seconds": time.time() - t0,
    }
    if catalog is not None:
        # The catalog's own time for each round's commit requests. Commit requests come only
        # from commit rounds (after the snapshot's), one by one and in order: matched from the
        # last one back, a round with `in_one_request` takes one, a round without takes one
        # per table; each match is checked against the round's span (1 s of slack for the
        # moment the driver read the line).
        reqs = catalog.since(t0)
        commits = [q for q in reqs if is_commit(q[1], q[2]) and q[3] < 400]
        matched: list[list[tuple]] = [[] for _ in all_rounds]
        k = len(commits)
        for i in range(len(all_rounds) - 1, -1, -1):
            r = all_rounds[i]
            need = 1 if r["in_one_request"] else r["tables"]
            matched[i] = commits[max(0, k - need):k]
            k -= need
            if len(matched[i]) != need or any(not (r["end"] - r["round_ms"] / 1000 - 1 <= q[0] <= r["end"] + 1)
                                              for q in matched[i]):
                raise SystemExit(f"{ws}: the catalog's commit requests do not line up with the commit rounds "
                                 f"(round {i} of {len(all_rounds)}); see {catalog.logfile} and {logfile}")
        index = {id(r): i for i, r in enumerate(all_rounds)}
        res["server_ms"] = [sum(q[4] for q in matched[index[id(r)]]) for r in measured]
        res["commit_requests"] = [len(matched[index[id(r)]]) for r in measured]
        # Every request from the end of the last warm-up round to the end of the last
        # measured one (plus the slack), per round.
        lo = full[P["WARMUP"] - 1]["end"] + 0.005 if P["WARMUP"] else t0
        res["requests"] = [len([q for q in reqs if lo < q[0] <= measured[-1]["end"] + 0.05]) / len(measured)]
        # Refused commits (a 404 of a table not yet created is how creation starts).
        res["errors"] = len([q for q in reqs if q[3] >= 400 and is_commit(q[1], q[2])])
    log(f"{ws}: {len(measured)} rounds, round p50 {pct(res['round_ms'], 50):.1f} ms p99 {pct(res['round_ms'], 99):.1f} ms, "
        f"catalog p50 {pct(res['catalog_ms'], 50):.1f} ms, {res['partial_rounds']} partial rounds, "
        f"{txs} transactions in {res['seconds']:.0f} s, peak {res['peak_mib']} MiB")
    return res


# --------------------------------------------------------------------------------------------
# PyIceberg's append through the same catalog
# --------------------------------------------------------------------------------------------


def run_pyiceberg(n: int, run: int, catalog: Catalog) -> dict:
    import pyarrow as pa
    from pyiceberg.schema import Schema
    from pyiceberg.types import DecimalType, LongType, NestedField, StringType, TimestamptzType
    from rest_catalog import pyiceberg_client

    cat = pyiceberg_client(catalog.uri, credential=CREDENTIAL, warehouse="wh")
    ns = f"pyiceberg_{n}_r{run}"
    cat.create_namespace(ns)
    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "amount", DecimalType(12, 2), required=True),
                    NestedField(3, "note", StringType(), required=False), NestedField(4, "at", TimestamptzType(), required=True),
                    identifier_field_ids=[1])
    tables = [cat.create_table((ns, t), schema=schema) for t in table_names(n)]
    arrow_schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("amount", pa.decimal128(12, 2), nullable=False),
                              pa.field("note", pa.string()), pa.field("at", pa.timestamp("us", tz="UTC"), nullable=False)])
    rng = random.Random(11)
    next_id = 1
    t0 = time.time()
    one, rounds = [], []
    for r in range(P["WARMUP"] + P["ROUNDS"]):
        ids = list(range(next_id, next_id + ROWS_PER_ROUND))
        next_id += ROWS_PER_ROUND
        batch = pa.table({"id": ids, "amount": [Decimal(rng.randint(0, 100000)) / 100 for _ in ids],
                          "note": [f"row {i}" for i in ids],
                          "at": [dt.datetime.now(dt.timezone.utc)] * len(ids)}, schema=arrow_schema)
        started = time.perf_counter()
        times = []
        for t in tables:
            a = time.perf_counter()
            t.append(batch)
            times.append(time.perf_counter() - a)
        took = time.perf_counter() - started
        if r >= P["WARMUP"]:
            one.extend(x * 1000 for x in times)
            rounds.append(took * 1000)
        time.sleep(max(0.0, interval_s(COMMIT_INTERVAL) - took))
    # The catalog's own time for the appends' commits: n per round, in order.
    commits = [q[4] for q in catalog.since(t0) if is_commit(q[1], q[2]) and f"/namespaces/{ns}/" in q[2]]
    if len(commits) != n * (P["WARMUP"] + P["ROUNDS"]):
        raise SystemExit(f"pyiceberg {n} tables: {len(commits)} commit requests in the catalog's log, "
                         f"expected {n * (P['WARMUP'] + P['ROUNDS'])}; see {catalog.logfile}")
    server = [sum(commits[k * n:(k + 1) * n]) for k in range(P["WARMUP"], P["WARMUP"] + P["ROUNDS"])]
    log(f"pyiceberg {n} tables: append p50 {pct(one, 50):.1f} ms p99 {pct(one, 99):.1f} ms, "
        f"round p50 {pct(rounds, 50):.1f} ms p99 {pct(rounds, 99):.1f} ms, catalog server per round p50 "
        f"{pct(server, 50):.1f} ms")
    return {"append_ms": one, "round_ms": rounds, "server_ms": server}


# --------------------------------------------------------------------------------------------
# The run and its report
# --------------------------------------------------------------------------------------------


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    counts = sorted({1, P["TABLES_MAX"]})
    catalogs: dict[str, Catalog] = {}
    started = time.time()
    try:
        catalogs["rest-tx"] = Catalog("tx", transactions=True)
        catalogs["rest-notx"] = Catalog("notx", transactions=False)
        #: (n, sink) -> list of per-run results
        res: dict[tuple[int, str], list[dict]] = {}
        for run in range(P["RUNS"]):
            for n in counts:
                # Each run alternates the order of the sinks.
                order = SINKS if run % 2 == 0 else SINKS[::-1]
                for sink in order:
                    res.setdefault((n, sink), []).append(run_skippr(sink, n, run, catalogs.get(sink)))
                res.setdefault((n, "pyiceberg"), []).append(run_pyiceberg(n, run, catalogs["rest-tx"]))
    finally:
        for c in catalogs.values():
            c.stop()
    took = time.time() - started

    def pooled(n: int, sink: str, key: str) -> list[float]:
        return [x for r in res[(n, sink)] for x in r[key]]

    def pp(xs: list[float]) -> str:
        return f"{pct(xs, 50):.1f} / {pct(xs, 99):.1f}"

    params = {"ROUNDS": P["ROUNDS"], "WARMUP": P["WARMUP"], "RATE": P["RATE"], "TABLES_MAX": P["TABLES_MAX"],
              "SEED": P["SEED"], "RUNS": P["RUNS"], "COMMIT_INTERVAL": COMMIT_INTERVAL,
              "CATALOG_NODELAY": int(CATALOG_NODELAY)}
    out = [
        f"`{command_line({k: str(v) for k, v in params.items()}, 'benches/rest_commits.sh')}`",
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} in {took / 60:.1f} min; {machine()}; "
        f"skipprd {binary_kind(BIN)} build of {binary_time(BIN)} (source tree at {source_version(REPO)}). "
        f"{P['ROUNDS']} rounds per row after {P['WARMUP']} warm-up rounds, {P['RATE']} transactions/s "
        f"(one row into every table each), about {ROWS_PER_ROUND} rows per table per round.",
        "",
        "| tables | sink | round p50 / p99 ms | catalog request p50 / p99 ms (skipprd) | catalog server p50 / p99 ms per round "
        "| requests per round (commits) | round p50 / local | round p99 / local | skipprd peak RSS MiB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    labels = {"local": "LocalIceberg (sqlite)", "rest-tx": "RestIceberg, `transactions/commit`",
              "rest-notx": "RestIceberg, table by table"}
    for n in counts:
        base = pooled(n, "local", "round_ms")
        for sink in SINKS:
            rounds = pooled(n, sink, "round_ms")
            cat = pooled(n, sink, "catalog_ms")
            rss = max(r["peak_mib"] for r in res[(n, sink)])
            if sink == "local":
                server, reqs = "-", "-"
            else:
                srv = pooled(n, sink, "server_ms")
                server = pp(srv)
                every = pooled(n, sink, "requests")
                commits = pooled(n, sink, "commit_requests")
                reqs = f"{sum(every) / len(every):.1f} ({sum(commits) / len(commits):.1f})"
            catalog = pp(cat) if sink == "rest-tx" else "- (inside the round)"
            out.append(f"| {n} | {labels[sink]} | {pp(rounds)} | {catalog} | {server} | {reqs} | "
                       f"{pct(rounds, 50) / pct(base, 50):.2f}x | {pct(rounds, 99) / pct(base, 99):.2f}x | {rss} |")
        py = res[(n, "pyiceberg")]
        app = [x for r in py for x in r["append_ms"]]
        rnd = [x for r in py for x in r["round_ms"]]
        srv = [x for r in py for x in r["server_ms"]]
        out.append(f"| {n} | PyIceberg `append` ({'one table' if n == 1 else f'{n} in a row'}; one append "
                   f"{pp(app)}) | {pp(rnd)} | - | {pp(srv)} | {n:.1f} ({n:.1f}) | {pct(rnd, 50) / pct(base, 50):.2f}x | "
                   f"{pct(rnd, 99) / pct(base, 99):.2f}x | - |")
    out.append("")
    for n in counts:
        rest = [r for r in res[(n, "rest-tx")]]
        files = [a - b for r in rest for a, b in zip(r["round_ms"], r["catalog_ms"])]
        out.append(f"- {n} table(s), RestIceberg with `transactions/commit`: the round without its catalog request "
                   f"(data and delete files, manifests, manifest list; round_ms - catalog_ms) p50 / p99 {pp(files)} ms.")
    for n in counts:
        tx, notx, py = (pooled(n, s, "round_ms") for s in ("rest-tx", "rest-notx", "local"))
        pyr = [x for r in res[(n, "pyiceberg")] for x in r["round_ms"]]
        out.append(f"- {n} table(s): REST with transactions / PyIceberg round p50 {pct(tx, 50) / pct(pyr, 50):.2f}x, "
                   f"p99 {pct(tx, 99) / pct(pyr, 99):.2f}x; table by table / with transactions p50 "
                   f"{pct(notx, 50) / pct(tx, 50):.2f}x, p99 {pct(notx, 99) / pct(tx, 99):.2f}x.")
    for n in counts:
        parts = []
        for sink in SINKS:
            first = [x for r in res[(n, sink)] for x in r["round_ms"][:20]]
            last = [x for r in res[(n, sink)] for x in r["round_ms"][-20:]]
            parts.append(f"{labels[sink]} {pct(first, 50):.1f} / {pct(last, 50):.1f}")
        first = [x for r in res[(n, "pyiceberg")] for x in r["round_ms"][:20]]
        last = [x for r in res[(n, "pyiceberg")] for x in r["round_ms"][-20:]]
        parts.append(f"PyIceberg {pct(first, 50):.1f} / {pct(last, 50):.1f}")
        out.append(f"- {n} table(s), round p50 ms of the first / the last 20 measured rounds (maintenance is off: "
                   f"every commit adds a snapshot that stays): {'; '.join(parts)}.")
    partial = {f"{n}/{s}": sum(r["partial_rounds"] for r in res[(n, s)]) for n in counts for s in SINKS}
    errors = {f"{n}/{s}": sum(r.get("errors", 0) for r in res[(n, s)]) for n in counts for s in SINKS if s != "local"}
    out.append(f"- Rounds with fewer tables than the workload touches (not counted): {partial}; "
               f"refused commit requests during the Skippr runs: {errors}.")
    text = "\n".join(out)
    (WORK / "results.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
