//! Config, `skippr.query`: the Postgres-wire gateway's listen address, users, statement
//! timeout, connection and memory limits, partitions and TLS, checked and resolved into a
//! [`QueryConfig`].

use std::path::Path;

use super::locate::Segment;
use super::{
    keys, model, normalize, parse_bytes, parse_pg_duration, QueryConfig, SkipprFile, Validator,
};

impl Validator<'_> {
    pub(super) fn socket_addr(&mut self, at: &[&str], value: &str) -> std::net::SocketAddr {
        match value.parse() {
            Ok(a) => a,
            Err(_) => {
                self.report(
                    keys(at),
                    format!("`{value}` is not an address: write `host:port` with an IP address, e.g. 127.0.0.1:5433 or 0.0.0.0:5433"),
                );
                std::net::SocketAddr::from(([127, 0, 0, 1], 0))
            }
        }
    }

    pub(super) fn query_config(&mut self, file: &SkipprFile, base: &Path) -> QueryConfig {
        let q = file.skippr.query.clone().unwrap_or_default();
        let listen = self.socket_addr(
            &["skippr", "query", "listen"],
            q.listen.as_deref().unwrap_or(model::DEFAULT_QUERY_LISTEN),
        );
        let mut seen = std::collections::HashSet::new();
        for (i, u) in q.users.iter().enumerate() {
            let mut at = keys(&["skippr", "query", "users"]);
            at.push(Segment::Index(i));
            if u.name.is_empty() {
                let mut p = at.clone();
                p.push(Segment::Key("name".into()));
                self.report(p, "a user needs a name");
            } else if !seen.insert(u.name.clone()) {
                let mut p = at.clone();
                p.push(Segment::Key("name".into()));
                self.report(p, format!("user `{}` is listed twice", u.name));
            }
            if u.password.is_empty() {
                at.push(Segment::Key("password".into()));
                self.report(at, format!("user `{}` needs a non-empty password (for example `${{ANALYST_PASSWORD}}`)", u.name));
            }
        }
        if q.users.is_empty() && !listen.ip().is_loopback() {
            self.report(
                keys(&["skippr", "query", "listen"]),
                format!("`{listen}` accepts clients from other machines, but no users are configured, and without users only loopback clients may connect; add `users:` (name and password) or listen on 127.0.0.1"),
            );
        }
        let statement_timeout = q
            .statement_timeout
            .as_deref()
            .unwrap_or(model::DEFAULT_STATEMENT_TIMEOUT);
        let statement_timeout = match parse_pg_duration(statement_timeout) {
            Some(d) => (!d.is_zero()).then_some(d),
            None => {
                self.report(
                    keys(&["skippr", "query", "statement_timeout"]),
                    format!("`{statement_timeout}` is not a duration: write e.g. `500ms`, `30s`, `5min` or `1h` (`0` for no limit)"),
                );
                None
            }
        };
        let max_connections = q.max_connections.unwrap_or(model::DEFAULT_MAX_CONNECTIONS);
        if max_connections == 0 || max_connections > 100_000 {
            self.report(
                keys(&["skippr", "query", "max_connections"]),
                format!("{max_connections} is not between 1 and 100000"),
            );
        }
        // One statement may use `max_query_memory` (1GiB unless set; at most an explicit
        // `max_memory` then, so that `max_memory: 512MiB` alone is a whole setting).
        let max_query_memory = match q.max_query_memory.as_deref() {
            Some(memory) => match parse_bytes(memory) {
                Some(b) if b >= 1024 * 1024 => b,
                _ => {
                    self.report(
                        keys(&["skippr", "query", "max_query_memory"]),
                        format!(
                            "`{memory}` is not a size of at least 1MiB: write e.g. `512MiB` or `2GiB`"
                        ),
                    );
                    0
                }
            },
            None => {
                let default =
                    parse_bytes(model::DEFAULT_MAX_QUERY_MEMORY).unwrap_or(1024 * 1024 * 1024);
                q.max_memory
                    .as_deref()
                    .and_then(parse_bytes)
                    .filter(|b| *b >= 16 * 1024 * 1024)
                    .map_or(default, |b| b.min(default))
            }
        };
        let target_partitions = match q.target_partitions {
            None => model::default_target_partitions(),
            Some(n @ 1..=1024) => usize::try_from(n).unwrap_or(1),
            Some(n) => {
                self.report(
                    keys(&["skippr", "query", "target_partitions"]),
                    format!("{n} is not between 1 and 1024: twice the cores suits most machines"),
                );
                1
            }
        };
        let max_memory = match q.max_memory.as_deref() {
            None => model::default_max_memory().max(max_query_memory),
            Some(text) => match parse_bytes(text) {
                Some(b) if b >= 16 * 1024 * 1024 => {
                    if q.max_query_memory.is_some() && b < max_query_memory {
                        self.report(
                            keys(&["skippr", "query", "max_memory"]),
                            format!("`{text}` is less than skippr.query.max_query_memory, which is what one statement may use: raise max_memory or lower max_query_memory"),
                        );
                    }
                    b
                }
                _ => {
                    self.report(
                        keys(&["skippr", "query", "max_memory"]),
                        format!("`{text}` is not a size of at least 16MiB: write e.g. `4GiB`"),
                    );
                    0
                }
            },
        };
        let max_concurrent_statements = match q.max_concurrent_statements {
            None => model::default_max_concurrent_statements(),
            Some(n @ 1..=10_000) => usize::try_from(n).unwrap_or(1),
            Some(n) => {
                self.report(
                    keys(&["skippr", "query", "max_concurrent_statements"]),
                    format!("{n} is not between 1 and 10000: twice the cores suits most machines"),
                );
                1
            }
        };
        let log_min_duration = match q.log_min_duration.as_deref() {
            None => None,
            Some(text) => match parse_pg_duration(text) {
                Some(d) => Some(d),
                None => {
                    self.report(
                        keys(&["skippr", "query", "log_min_duration"]),
                        format!("`{text}` is not a duration: write e.g. `250ms`, `2s` or `1min` (`0ms` logs every statement; leave the key out to log none)"),
                    );
                    None
                }
            },
        };
        let spill_path = match q.spill_path.as_deref() {
            Some(p) if p.trim().is_empty() => {
                self.report(
                    keys(&["skippr", "query", "spill_path"]),
                    "must not be empty: give a folder, or leave the key out",
                );
                None
            }
            Some(p) => Some(normalize(&base.join(p))),
            None => None,
        };
        QueryConfig {
            max_memory,
            spill_path,
            max_concurrent_statements,
            log_min_duration,
            admins: q
                .users
                .iter()
                .filter(|u| u.admin)
                .map(|u| u.name.clone())
                .collect(),
            statement_timeout,
            target_partitions,
            max_connections: usize::try_from(max_connections).unwrap_or(usize::MAX),
            max_query_memory,
            listen,
            users: q
                .users
                .iter()
                .map(|u| (u.name.clone(), u.password.clone()))
                .collect(),
            tls: q.tls.as_ref().map(|t| {
                (
                    normalize(&base.join(&t.cert)),
                    normalize(&base.join(&t.key)),
                )
            }),
        }
    }
}
