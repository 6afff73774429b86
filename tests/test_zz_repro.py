import time
import psycopg
from conftest import Skippr, Database, free_port

def test_repro(skippr: Skippr, db: Database) -> None:
    db.execute("CREATE TABLE orders (id bigint PRIMARY KEY, amount numeric(12,2), note text)")
    db.execute("INSERT INTO orders SELECT g, g * 0.5, 'o' || g FROM generate_series(1, 50) g")
    port = free_port()
    skippr.write_config(["orders"], query={"listen": f"127.0.0.1:{port}"})
    skippr.sync_once()
    proc = skippr.start("serve")
    try:
        time.sleep(3)
        with psycopg.connect(host="127.0.0.1", port=port, dbname="analytics", user="skippr", autocommit=True) as c:
            for r in c.execute("EXPLAIN VERBOSE SELECT (SELECT count(*) FROM orders WHERE id = %s) AS a", (1,)).fetchall():
                print(r[0], "::", r[1][:300])
    finally:
        proc.terminate(); proc.wait()
