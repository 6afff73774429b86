//! Gateway, property tests of what a client sends: start-up and query-phase messages as
//! bytes, damaged at random (through the frame check, the decoder never panics and never
//! loses a message boundary), and statements (the classifier never panics and never lets a
//! write through). Generated inputs come from a seeded generator;
//! `SKIPPR_FUZZ_ITERATIONS` runs longer, `SKIPPR_FUZZ_SEED` replays a failure.

use std::sync::Arc;

use bytes::{BufMut, BytesMut};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::logical_expr::LogicalPlan;
use datafusion::prelude::SessionContext;
use datafusion::sql::sqlparser::ast::{CopyTarget, Set, Statement};
use pgwire::messages::{DecodeContext, PgWireFrontendMessage, ProtocolVersion};

use super::planning::verify_read_only;
use super::readonly::{classify, Allowed, Policy};
use crate::error::sqlstate;

/// The statements the gateway reads from `sql` (its statement core, as a session calls it).
fn statements_of(
    sql: &str,
) -> Result<Vec<Statement>, datafusion::sql::sqlparser::parser::ParserError> {
    super::pg::parse::read(sql).map(|p| p.statements)
}

/// A small, seeded generator (xorshift64*): the same seed gives the same inputs.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn iterations(default: usize) -> usize {
    std::env::var("SKIPPR_FUZZ_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn seed() -> u64 {
    let seed = std::env::var("SKIPPR_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    // Printed so that a failure can be replayed with SKIPPR_FUZZ_SEED.
    eprintln!("fuzz seed {seed}");
    seed
}

/// A frontend message: type byte (none for start-up messages), length, body.
fn message(kind: Option<u8>, body: &[u8]) -> BytesMut {
    let mut buf = BytesMut::new();
    if let Some(k) = kind {
        buf.put_u8(k);
    }
    buf.put_i32(body.len() as i32 + 4);
    buf.put_slice(body);
    buf
}

fn cstr(buf: &mut Vec<u8>, s: &[u8]) {
    buf.extend_from_slice(s);
    buf.push(0);
}

/// Damages `buf`: `choice` 0 cuts it short, 1 flips a byte.
fn damage(rng: &mut Rng, choice: usize, buf: &mut BytesMut) {
    if buf.is_empty() {
        return;
    }
    let at = rng.below(buf.len());
    if choice == 0 {
        buf.truncate(at);
    } else {
        buf[at] ^= rng.next() as u8 | 1;
    }
}

/// A start-up, SSL, cancel or query-phase message, well formed or damaged.
fn frontend_message(rng: &mut Rng) -> (BytesMut, DecodeContext) {
    let mut ctx = DecodeContext::new(ProtocolVersion::PROTOCOL3_0);
    let starting = rng.below(2) == 0;
    ctx.awaiting_frontend_ssl = starting && rng.below(2) == 0;
    ctx.awaiting_frontend_startup = starting;
    let word = |rng: &mut Rng| {
        let n = rng.below(12);
        let mut w = rng.bytes(n);
        w.retain(|b| *b != 0);
        w
    };
    let mut buf = if starting {
        let mut body = Vec::new();
        match rng.below(4) {
            0 => body.extend_from_slice(&80877103i32.to_be_bytes()), // SSLRequest
            1 => {
                body.extend_from_slice(&80877102i32.to_be_bytes()); // CancelRequest
                let n = rng.below(40);
                body.extend_from_slice(&rng.bytes(n));
            }
            _ => {
                body.extend_from_slice(&196608i32.to_be_bytes()); // protocol 3.0
                for _ in 0..rng.below(5) {
                    let key = rng.pick(&["user", "database", "options", "application_name"]);
                    cstr(&mut body, key.as_bytes());
                    let value = word(rng);
                    cstr(&mut body, &value);
                }
                body.push(0);
            }
        }
        message(None, &body)
    } else {
        let kind = *[
            b'Q', b'P', b'B', b'E', b'D', b'C', b'S', b'H', b'X', b'p', b'd', b'c', b'f',
        ]
        .get(rng.below(13))
        .unwrap_or(&b'Q');
        let mut body = Vec::new();
        match kind {
            b'Q' => cstr(&mut body, statement(rng).as_bytes()),
            b'P' => {
                cstr(&mut body, &word(rng));
                cstr(&mut body, statement(rng).as_bytes());
                let n = rng.below(4) as i16;
                body.extend_from_slice(&n.to_be_bytes());
                for _ in 0..n {
                    body.extend_from_slice(&(rng.next() as i32).to_be_bytes());
                }
            }
            _ => {
                let n = rng.below(64);
                body.extend_from_slice(&rng.bytes(n))
            }
        }
        message(Some(kind), &body)
    };
    // Damage some: truncate, flip a byte, or lie about the length.
    let choice = rng.below(6);
    match choice {
        0 | 1 => damage(rng, choice, &mut buf),
        2 if buf.len() > 5 => {
            let at = if starting { 0 } else { 1 };
            let lie = (rng.next() as i32).to_be_bytes();
            buf[at..at + 4].copy_from_slice(&lie);
        }
        _ => {}
    }
    (buf, ctx)
}

/// Pieces of statements a hostile client would try, joined at random.
const WRITES: &[&str] = &[
    "INSERT INTO orders VALUES (1, 'x')",
    "UPDATE orders SET note = 'x'",
    "DELETE FROM orders",
    "MERGE INTO orders o USING orders s ON o.id = s.id WHEN MATCHED THEN DELETE",
    "TRUNCATE orders",
    "DROP TABLE orders",
    "CREATE TABLE t AS SELECT * FROM orders",
    "CREATE EXTERNAL TABLE t STORED AS CSV LOCATION '/tmp/x'",
    "CREATE VIEW v AS SELECT 1",
    "ALTER TABLE orders ADD COLUMN y int",
    "COPY orders TO '/tmp/out'",
    "COPY (SELECT * FROM orders) TO '/tmp/out'",
    "COPY orders FROM '/tmp/in'",
    "COPY orders FROM STDIN",
    "COPY (SELECT 1) TO PROGRAM 'id'",
    "SET datafusion.execution.target_partitions = 1",
    "SET datafusion.runtime.memory_limit = '1G'",
    "SET ROLE postgres",
    "GRANT SELECT ON orders TO public",
];

const READS: &[&str] = &[
    "SELECT * FROM orders",
    "SELECT id, count(*) FROM orders GROUP BY id",
    "WITH a AS (SELECT 1 AS x) SELECT x FROM a",
    "VALUES (1), (2)",
    "TABLE orders",
    "SHOW search_path",
    "SET search_path = analytics",
    "SET statement_timeout = '1s'",
    "RESET ALL",
    "BEGIN",
    "COMMIT",
    "EXPLAIN SELECT * FROM orders",
    "COPY orders TO STDOUT",
    "COPY (SELECT id FROM orders) TO STDOUT WITH (FORMAT csv)",
    "DECLARE c CURSOR FOR SELECT * FROM orders",
    "FETCH 10 FROM c",
    "PREPARE p AS SELECT * FROM orders WHERE id = $1",
    "EXECUTE p(1)",
    "DISCARD ALL",
];

const WRAPPERS: &[&str] = &[
    "{}",
    "EXPLAIN {}",
    "EXPLAIN ANALYZE {}",
    "EXPLAIN (ANALYZE) {}",
    "EXPLAIN VERBOSE {}",
    "WITH w AS ({}) SELECT * FROM w",
    "WITH w AS ({} RETURNING *) SELECT * FROM w",
    "SELECT * FROM ({}) s",
    "SELECT 1 UNION ALL {}",
    "PREPARE q AS {}",
    "DECLARE k CURSOR FOR {}",
    "COPY ({}) TO STDOUT",
    "COPY ({}) TO '/tmp/f'",
    "/* c */ {} -- x",
    "{}; {}",
    "SELECT * INTO newt FROM ({}) s",
    "SELECT * FROM orders FOR UPDATE",
];

fn statement(rng: &mut Rng) -> String {
    let inner = if rng.below(2) == 0 {
        rng.pick(WRITES)
    } else {
        rng.pick(READS)
    };
    let wrapper = rng.pick(WRAPPERS);
    let mut sql = wrapper
        .replacen("{}", inner, 1)
        .replacen("{}", rng.pick(READS), 1);
    // Perturb: case, whitespace, stray characters.
    match rng.below(5) {
        0 => sql = sql.to_lowercase(),
        1 => sql = sql.replace(' ', "\n\t "),
        2 => {
            let at = rng.below(sql.len() + 1);
            if sql.is_char_boundary(at) {
                let junk = rng.pick(&["'", "\"", ";", "(", ")", "$1", "\\", "--", "*/"]);
                sql.insert_str(at, junk);
            }
        }
        _ => {}
    }
    sql
}

fn test_context() -> SessionContext {
    let ctx = SessionContext::new();
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("note", DataType::Utf8, true),
    ]));
    // A table the engine can write to, so that a write that got through would plan as one.
    let _ = ctx.register_batch("orders", RecordBatch::new_empty(schema));
    ctx
}

/// Whether the engine, left to itself, would plan `plan` as anything but a read.
fn writes(plan: &LogicalPlan) -> bool {
    verify_read_only(plan).is_err()
}

/// The independent check of an allowed statement: what it would do, judged without the
/// classifier (by the engine's own plan, or by the statement's target).
async fn assert_not_a_write(ctx: &SessionContext, statement: &Statement, allowed: Allowed) {
    match (allowed, statement) {
        (Allowed::Query | Allowed::Explain, s) => {
            let planned = super::planning::plan_statement(ctx, s).await;
            if let Ok(plan) = planned {
                assert!(!writes(&plan), "accepted a write: {s}");
            }
        }
        (Allowed::CopyOut, Statement::Copy { to, target, .. }) => {
            assert!(*to && *target == CopyTarget::Stdout, "accepted {statement}");
        }
        (Allowed::Set, Statement::Set(Set::SingleAssignment { variable, .. })) => {
            let name = variable.to_string().to_ascii_lowercase();
            assert!(!name.starts_with("datafusion"), "accepted {statement}");
        }
        (Allowed::Set, Statement::Set(Set::SetRole { .. })) => panic!("accepted {statement}"),
        _ => {}
    }
}

/// A query-phase message of the extended protocol (or another typed one), well formed,
/// then often damaged: fields cut short, counts that disagree with what follows, lengths
/// that lie, bytes left over.
fn extended_message(rng: &mut Rng) -> Vec<u8> {
    let kind = *[
        b'P', b'B', b'E', b'D', b'C', b'S', b'H', b'Q', b'd', b'c', b'f', b'p', b'F',
    ]
    .get(rng.below(13))
    .unwrap_or(&b'B');
    let mut body = Vec::new();
    let small = |rng: &mut Rng| rng.below(4) as u16;
    match kind {
        b'P' => {
            cstr(&mut body, b"s1");
            cstr(&mut body, statement(rng).as_bytes());
            let n = small(rng);
            body.extend_from_slice(&n.to_be_bytes());
            for _ in 0..n {
                body.extend_from_slice(&(rng.next() as u32).to_be_bytes());
            }
        }
        b'B' => {
            cstr(&mut body, b"");
            cstr(&mut body, b"s1");
            let formats = small(rng);
            body.extend_from_slice(&formats.to_be_bytes());
            for _ in 0..formats {
                body.extend_from_slice(&(rng.below(3) as i16).to_be_bytes());
            }
            let values = small(rng);
            body.extend_from_slice(&values.to_be_bytes());
            for _ in 0..values {
                let len = rng.below(6) as i32 - 2;
                body.extend_from_slice(&len.to_be_bytes());
                body.extend(rng.bytes(len.max(0) as usize));
            }
            let results = small(rng);
            body.extend_from_slice(&results.to_be_bytes());
            for _ in 0..results {
                body.extend_from_slice(&(rng.below(2) as i16).to_be_bytes());
            }
        }
        b'E' => {
            cstr(&mut body, b"");
            body.extend_from_slice(&(rng.next() as i32).to_be_bytes());
        }
        b'D' | b'C' => {
            body.push(*[b'S', b'P', b'Z'].get(rng.below(3)).unwrap_or(&b'S'));
            cstr(&mut body, b"s1");
        }
        b'Q' | b'f' => cstr(&mut body, statement(rng).as_bytes()),
        b'p' => {
            cstr(&mut body, b"SCRAM-SHA-256");
            let n = rng.below(40);
            body.extend_from_slice(&(n as i32).to_be_bytes());
            body.extend(rng.bytes(n));
        }
        _ => {
            let n = rng.below(8);
            body.extend(rng.bytes(n));
        }
    }
    // Damage most of them.
    let choice = rng.below(5);
    match choice {
        0 | 1 => {
            let mut b = BytesMut::from(&body[..]);
            damage(rng, choice, &mut b);
            body = b.to_vec();
        }
        2 => {
            let n = 1 + rng.below(4);
            body.extend(rng.bytes(n));
        }
        _ => {}
    }
    let mut m = vec![kind];
    let mut len = body.len() as i32 + 4;
    if rng.below(8) == 0 {
        len = rng.next() as i32 % 64;
    }
    m.extend_from_slice(&len.to_be_bytes());
    m.extend(body);
    m
}

/// The whole lengths (type byte included) of the typed messages in `bytes`.
fn frame_lengths(bytes: &[u8]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut rest = bytes;
    while rest.len() >= 5 {
        let len = i32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]).max(0) as usize;
        let whole = (1 + len).min(rest.len());
        out.push(whole);
        rest = &rest[whole..];
    }
    out
}

/// Every message a client can send, damaged or not, goes through the frame check: what
/// the check lets through, the protocol library decodes without panicking and to exactly
/// the message's bytes (so the next message starts where it should); the rest is a
/// violation (08P01). Start-up messages, which anyone can send, are decoded as they arrive
/// (the library checks those itself) and must not panic either.
#[tokio::test]
async fn no_message_panics_the_decoder_and_checked_ones_decode_whole() {
    use super::frames::Checked;
    use tokio::io::AsyncReadExt;

    let mut rng = Rng::new(seed());
    let quiet = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let startup: &[u8] = b"\0\0\0\x10\0\x03\0\0user\0a\0\0";
    let (mut passed, mut refused, mut startup_panics) = (0usize, 0usize, 0usize);
    let mut failures = Vec::new();
    for _ in 0..iterations(20_000) {
        let (buf, ctx) = frontend_message(&mut rng);
        if ctx.awaiting_frontend_startup {
            let outcome = std::panic::catch_unwind(move || {
                let mut buf = buf;
                let _ = PgWireFrontendMessage::decode(&mut buf, &ctx);
            });
            startup_panics += usize::from(outcome.is_err());
        }
        // A client's messages after start-up: one to three, each through the check.
        let mut stream = startup.to_vec();
        let sent: Vec<Vec<u8>> = (0..1 + rng.below(3))
            .map(|_| extended_message(&mut rng))
            .collect();
        for m in &sent {
            stream.extend_from_slice(m);
        }
        let mut checked = Checked::new(&stream[..], BytesMut::new());
        checked.authenticated();
        let mut delivered = Vec::new();
        let violation = checked.read_to_end(&mut delivered).await.is_err();
        let framed = delivered[startup.len().min(delivered.len())..].to_vec();
        let mut buf = BytesMut::from(&framed[..]);
        let outcome = std::panic::catch_unwind(move || {
            let mut ctx = DecodeContext::new(ProtocolVersion::PROTOCOL3_0);
            ctx.awaiting_frontend_ssl = false;
            ctx.awaiting_frontend_startup = false;
            let mut lengths = Vec::new();
            while !buf.is_empty() {
                let before = buf.len();
                match PgWireFrontendMessage::decode(&mut buf, &ctx) {
                    Ok(Some(_)) => lengths.push(before - buf.len()),
                    // The library refuses some messages itself (a message type it does
                    // not know): an error, which ends the connection, not a panic.
                    Err(_) => return Ok(lengths),
                    Ok(None) => return Err("a checked message did not decode whole"),
                }
            }
            Ok(lengths)
        });
        match outcome {
            Ok(Ok(lengths)) => {
                // Each decoded message is exactly one message as framed by the check
                // (type byte and its length): the next one starts where it should. (A
                // length that lies about a CopyData, whose body may be anything, frames
                // the bytes differently from what the sender meant, consistently.)
                let whole = frame_lengths(&framed);
                let whole = &whole[..lengths.len().min(whole.len())];
                if lengths != whole {
                    failures.push(format!(
                        "decoded lengths {lengths:?}, sent {whole:?}: {sent:?}"
                    ));
                }
                passed += lengths.len();
            }
            Ok(Err(why)) => failures.push(format!("{why}: {sent:?}")),
            Err(_) => failures.push(format!("the decoder panicked on checked messages {sent:?}")),
        }
        refused += usize::from(violation);
    }
    std::panic::set_hook(quiet);
    assert_eq!(
        startup_panics, 0,
        "the decoder panicked on a start-up message"
    );
    assert!(
        failures.is_empty(),
        "{} failures, first: {}",
        failures.len(),
        failures[0]
    );
    // The generator must exercise both sides, or the property says nothing.
    assert!(
        passed > 0 && refused > 0,
        "passed {passed}, refused {refused}"
    );
}

#[tokio::test]
async fn the_classifier_never_accepts_a_write() {
    let mut rng = Rng::new(seed());
    let ctx = test_context();
    let mut allowed_seen = 0usize;
    let mut refused_seen = 0usize;
    for _ in 0..iterations(3_000) {
        let sql = statement(&mut rng);
        let Ok(statements) = statements_of(&sql) else {
            continue;
        };
        for s in &statements {
            match classify(s, &Policy::default()) {
                Ok(allowed) => {
                    allowed_seen += 1;
                    assert_not_a_write(&ctx, s, allowed).await;
                }
                Err(refusal) => {
                    refused_seen += 1;
                    assert!(
                        [
                            sqlstate::READ_ONLY_SQL_TRANSACTION,
                            sqlstate::INSUFFICIENT_PRIVILEGE,
                            sqlstate::UNDEFINED_OBJECT
                        ]
                        .contains(&refusal.sqlstate),
                        "{s}: {refusal:?}"
                    );
                    assert!(!refusal.message.is_empty());
                }
            }
        }
    }
    // The generator must exercise both sides, or the property says nothing.
    assert!(allowed_seen > 0 && refused_seen > 0);
}

#[tokio::test]
async fn every_known_write_is_refused_with_a_reason() {
    for sql in WRITES {
        // What does not parse never runs: the client gets a syntax error (42601).
        let statements = statements_of(sql).unwrap_or_default();
        for s in &statements {
            let refusal = classify(s, &Policy::default()).err();
            assert!(refusal.is_some(), "accepted {sql}");
        }
    }
    for sql in [
        "EXPLAIN ANALYZE COPY orders TO '/tmp/x'",
        "EXPLAIN COPY (SELECT 1) TO '/tmp/x'",
        "EXPLAIN ANALYZE INSERT INTO orders VALUES (1, 'x')",
        "WITH d AS (DELETE FROM orders RETURNING *) SELECT * FROM d",
        "SELECT * INTO newt FROM orders",
        "PREPARE p AS INSERT INTO orders VALUES (1, 'x')",
        "DECLARE c CURSOR FOR SELECT * FROM orders FOR UPDATE",
    ] {
        let statements = statements_of(sql).unwrap_or_default();
        assert!(
            statements
                .iter()
                .any(|s| classify(s, &Policy::default()).is_err()),
            "accepted {sql}"
        );
    }
    for sql in READS {
        for s in statements_of(sql).unwrap_or_default() {
            assert!(classify(&s, &Policy::default()).is_ok(), "refused {sql}");
        }
    }
}

/// The policy of a session that may build models: the workspace `analytics` (the default
/// schema) and the system schemas stay read-only.
fn models_policy() -> Policy {
    Policy {
        models: Some(super::readonly::Writable {
            read_only: vec![
                "analytics".into(),
                "skippr".into(),
                "pg_catalog".into(),
                "information_schema".into(),
            ],
            default_schema: "analytics".into(),
            temp_schema: "pg_temp_9".into(),
        }),
    }
}

#[tokio::test]
async fn models_never_open_the_workspace() {
    let mut rng = Rng::new(seed());
    let policy = models_policy();
    // Generated statements name the workspace's tables: a models policy changes nothing.
    for _ in 0..iterations(3_000) {
        let sql = statement(&mut rng);
        for s in statements_of(&sql).unwrap_or_default() {
            let with_models = classify(&s, &policy).map_err(|r| r.sqlstate);
            let without = classify(&s, &Policy::default()).map_err(|r| r.sqlstate);
            assert_eq!(with_models, without, "{s}");
        }
    }
    let write = |sql: &str| {
        statements_of(sql)
            .unwrap_or_default()
            .iter()
            .map(|s| classify(s, &policy))
            .collect::<Vec<_>>()
    };
    for sql in [
        "CREATE SCHEMA m",
        "CREATE TABLE m.t AS SELECT * FROM orders",
        "CREATE TEMPORARY TABLE t AS SELECT * FROM orders",
        "CREATE VIEW m.v AS SELECT * FROM orders",
        "INSERT INTO m.t SELECT * FROM orders",
        "DELETE FROM m.t WHERE id IN (SELECT id FROM orders)",
        "UPDATE m.t SET a = 1 FROM orders WHERE m.t.id = orders.id",
        "ALTER TABLE m.t RENAME TO u",
        "DROP TABLE IF EXISTS m.t CASCADE",
        "DROP SCHEMA m CASCADE",
        "COMMENT ON COLUMN m.t.a IS 'x'",
        "GRANT SELECT ON m.t TO someone",
        "TRUNCATE m.t",
    ] {
        assert_eq!(write(sql), vec![Ok(Allowed::Write)], "{sql}");
    }
    for sql in [
        "CREATE TABLE t AS SELECT 1",
        "CREATE TABLE m.t AS WITH d AS (DELETE FROM orders RETURNING *) SELECT * FROM d",
        "INSERT INTO orders SELECT * FROM m.t",
        "DELETE FROM orders USING m.t WHERE orders.id = m.t.id",
        "EXPLAIN ANALYZE INSERT INTO m.t VALUES (1)",
        "PREPARE p AS INSERT INTO m.t VALUES (1)",
        "WITH d AS (INSERT INTO m.t VALUES (1) RETURNING *) SELECT * FROM d",
        "ALTER TABLE analytics.orders RENAME TO o2",
        "ALTER TABLE m.t ADD COLUMN z integer",
        "TRUNCATE m.t, orders",
        "DROP SCHEMA analytics CASCADE",
        "CREATE SCHEMA pg_mine",
        "CREATE SCHEMA skippr",
        "GRANT SELECT ON orders TO someone",
        "COMMENT ON TABLE orders IS 'x'",
        "CREATE MATERIALIZED VIEW m.mv AS SELECT 1",
        "INSERT INTO m.t VALUES (1) ON CONFLICT DO NOTHING",
        "DELETE FROM m.t RETURNING *",
    ] {
        let got = write(sql);
        assert!(
            !got.is_empty() && got.iter().all(|r| r.is_err()),
            "{sql}: {got:?}"
        );
    }
}
