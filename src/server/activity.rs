//! Gateway, activity: every client session as `pg_stat_activity` shows it (its user, client,
//! state, current statement, and whether that statement waits for its turn), found by the
//! process id its BackendKeyData announced. `pg_cancel_backend` and `pg_terminate_backend`
//! reach a session through it, under the rule of `skippr.query.users` (a user reaches its own
//! sessions, an `admin` every one); a statement that took at least
//! `skippr.query.log_min_duration` is logged here when it ends.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant, SystemTime};

use futures::{Sink, SinkExt};
use pgwire::api::store::PortalStore;
use pgwire::api::{ClientPortalStore, DEFAULT_NAME, METADATA_APPLICATION_NAME};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::response::{NoticeResponse, TransactionStatus};
use pgwire::messages::PgWireBackendMessage;
use tokio::sync::watch;

use super::errors::PgError;
use super::limits::Interrupts;
use super::planning::Stmt;
use crate::error::sqlstate;

/// Characters of a statement's text kept for `pg_stat_activity.query` and the slow-statement
/// log (Postgres keeps 1 KiB: `track_activity_query_size`).
pub const QUERY_TEXT_LIMIT: usize = 1024;

/// What the client of a terminated session is told (FATAL 57P01), as Postgres words it.
pub const TERMINATED_MESSAGE: &str = "terminating connection due to administrator command";

/// `wait_event_type` and `wait_event` of a statement waiting for its turn
/// (`skippr.query.max_concurrent_statements`).
pub const QUEUE_WAIT: (&str, &str) = ("Queue", "StatementAdmission");

/// The sessions of the gateway, by process id, and the rules that apply to them.
pub struct Backends {
    sessions: Mutex<BTreeMap<i32, Weak<Backend>>>,
    /// Users that may cancel and terminate any session (`admin: true`).
    admins: HashSet<String>,
    /// No users are configured: every client is the same, trusted, user.
    trust: bool,
    /// Statements that take at least this long are logged when they end.
    log_min_duration: Option<Duration>,
}

/// Who a session is, known once its start-up is done.
#[derive(Debug, Clone)]
struct Ident {
    pid: i32,
    user: String,
    database: String,
    client: Option<SocketAddr>,
    started: SystemTime,
}

/// Whether a transaction block is open, as the last statement left it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Block {
    #[default]
    None,
    Open,
    Failed,
}

/// What a session does now.
#[derive(Debug, Default)]
struct State {
    application_name: String,
    /// Whether a statement runs.
    active: bool,
    /// The current (or last) statement's text, truncated.
    query: String,
    query_start: Option<SystemTime>,
    xact_start: Option<SystemTime>,
    state_change: Option<SystemTime>,
    block: Block,
}

/// One client session.
pub struct Backend {
    backends: Arc<Backends>,
    interrupts: Arc<Interrupts>,
    terminate: watch::Sender<bool>,
    ident: OnceLock<Ident>,
    state: Mutex<State>,
    /// Whether the running statement waits for its turn.
    queued: AtomicBool,
    /// Rows the running statement produced so far.
    rows: AtomicU64,
    /// Notices for the client, sent after the statement's response (a signal's WARNING).
    notices: Mutex<Vec<ErrorInfo>>,
}

/// A session's entry in [`Backends`], removed when dropped (with the connection).
pub struct Registration {
    backends: Arc<Backends>,
    pid: i32,
}

impl Drop for Registration {
    fn drop(&mut self) {
        lock(&self.backends.sessions).remove(&self.pid);
    }
}

/// A signal one session sends another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// `pg_cancel_backend`: ends the running statement (57014), as a cancel request does.
    Cancel,
    /// `pg_terminate_backend`: closes the connection (FATAL 57P01).
    Terminate,
}

/// One row of `pg_stat_activity`.
#[derive(Debug, Clone)]
pub struct Activity {
    pub pid: i32,
    pub database: String,
    pub user: String,
    pub application_name: String,
    pub client: Option<SocketAddr>,
    pub backend_start: SystemTime,
    pub xact_start: Option<SystemTime>,
    pub query_start: Option<SystemTime>,
    pub state_change: Option<SystemTime>,
    pub state: &'static str,
    /// Waits for its turn (`wait_event_type` [`QUEUE_WAIT`]).
    pub queued: bool,
    pub query: String,
    /// Whether the reader may see more than who the session is (see [`Backends::snapshot`]).
    pub visible: bool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `text` cut to [`QUERY_TEXT_LIMIT`] characters.
pub fn truncated(text: &str) -> String {
    match text.char_indices().nth(QUERY_TEXT_LIMIT) {
        Some((end, _)) => text[..end].to_string(),
        None => text.to_string(),
    }
}

impl Backends {
    /// `admins`: the users with `admin: true`; `trust`: no users are configured.
    pub fn new(
        admins: HashSet<String>,
        trust: bool,
        log_min_duration: Option<Duration>,
    ) -> Arc<Self> {
        Arc::new(Self {
            sessions: Mutex::default(),
            admins,
            trust,
            log_min_duration,
        })
    }

    fn find(&self, pid: i32) -> Option<Arc<Backend>> {
        lock(&self.sessions).get(&pid).and_then(Weak::upgrade)
    }

    /// Every session started, by process id, as it is now; as `viewer` may see it (`None`:
    /// the server itself, which sees everything). A session sees the details of those it may
    /// signal; of the others only who they are (as Postgres shows them without
    /// `pg_read_all_stats`).
    pub fn snapshot(&self, viewer: Option<&Backend>) -> Vec<Activity> {
        let live: Vec<Arc<Backend>> = lock(&self.sessions)
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        let viewer = viewer.map(|v| v.ident.get().map(|i| i.user.as_str()));
        live.iter()
            .filter_map(|b| b.activity())
            .map(|mut a| {
                a.visible = match viewer {
                    None => true,
                    Some(user) => self.may_signal(user.unwrap_or_default(), &a.user),
                };
                a
            })
            .collect()
    }

    /// Whether `caller` may signal a session of `target` (see the module doc).
    fn may_signal(&self, caller: &str, target: &str) -> bool {
        self.trust || caller == target || self.admins.contains(caller)
    }

    /// Sends `signal` from `caller` to session `pid`: the session it reached, or `None` (with
    /// Postgres's WARNING queued for the caller) when no session has that process id. A
    /// caller that may not signal it gets Postgres's 42501.
    pub fn signal(
        &self,
        caller: &Backend,
        pid: i64,
        signal: Signal,
    ) -> Result<Option<Arc<Backend>>, PgError> {
        let target = i32::try_from(pid).ok().and_then(|p| self.find(p));
        let Some((target, ident)) = target.and_then(|t| t.ident.get().cloned().map(|i| (t, i)))
        else {
            caller.notice(ErrorInfo::new(
                "WARNING".to_string(),
                sqlstate::WARNING.to_string(),
                format!("PID {pid} is not a PostgreSQL backend process"),
            ));
            return Ok(None);
        };
        let by = caller.ident.get();
        let by_user = by.map(|i| i.user.as_str()).unwrap_or_default();
        if !self.may_signal(by_user, &ident.user) {
            tracing::info!(pid, by_pid = by.map_or(0, |i| i.pid), by_user = %by_user, user = %ident.user, signal = ?signal, "refused a signal to another user's session");
            return Err(refusal(signal));
        }
        match signal {
            Signal::Cancel => {
                tracing::info!(pid, by_pid = by.map_or(0, |i| i.pid), by_user = %by_user, "pg_cancel_backend: cancelling the session's statement");
                target.interrupts.cancel();
            }
            Signal::Terminate => {
                tracing::info!(pid, by_pid = by.map_or(0, |i| i.pid), by_user = %by_user, "pg_terminate_backend: closing the session");
                target.terminate.send_replace(true);
            }
        }
        Ok(Some(target))
    }

    /// Waits, blocking the thread, until session `pid` is gone or `timeout` passed; whether it
    /// is gone. A worker of the runtime hands its other tasks over while it waits.
    pub fn wait_gone(&self, pid: i32, timeout: Duration) -> bool {
        let wait = || {
            let deadline = Instant::now() + timeout;
            loop {
                if self.find(pid).is_none() {
                    return true;
                }
                if Instant::now() >= deadline {
                    return false;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        };
        match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
            Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(wait),
            // A single-threaded runtime would wait for itself: no wait there.
            Ok(_) => self.find(pid).is_none(),
            Err(_) => wait(),
        }
    }
}

/// Postgres's refusal of a signal to another user's session.
fn refusal(signal: Signal) -> PgError {
    let (message, detail) = match signal {
        Signal::Cancel => (
            "permission denied to cancel query",
            "Only the user whose query is being canceled, or a user with admin: true in skippr.query.users, may cancel this query.",
        ),
        Signal::Terminate => (
            "permission denied to terminate process",
            "Only the user whose process is being terminated, or a user with admin: true in skippr.query.users, may terminate this process.",
        ),
    };
    PgError {
        code: sqlstate::INSUFFICIENT_PRIVILEGE,
        message: message.to_string(),
        detail: Some(detail.to_string()),
    }
}

impl Backend {
    /// A session of `backends`, whose statements `interrupts` stops; listed once registered.
    pub fn new(backends: Arc<Backends>, interrupts: Arc<Interrupts>) -> Arc<Self> {
        Arc::new(Self {
            backends,
            interrupts,
            terminate: watch::channel(false).0,
            ident: OnceLock::new(),
            state: Mutex::default(),
            queued: AtomicBool::new(false),
            rows: AtomicU64::new(0),
            notices: Mutex::default(),
        })
    }

    /// Lists the session under `pid` once its start-up is done; it stays listed while the
    /// returned entry lives.
    pub fn register(
        self: &Arc<Self>,
        pid: i32,
        meta: &HashMap<String, String>,
        client: Option<SocketAddr>,
    ) -> Registration {
        let user = meta
            .get(pgwire::api::METADATA_USER)
            .cloned()
            .unwrap_or_default();
        let database = meta
            .get(pgwire::api::METADATA_DATABASE)
            .cloned()
            .unwrap_or_else(|| user.clone());
        let _ = self.ident.set(Ident {
            pid,
            user,
            database,
            client,
            started: SystemTime::now(),
        });
        {
            let mut state = lock(&self.state);
            state.application_name = application_name(meta);
            state.state_change = Some(SystemTime::now());
        }
        lock(&self.backends.sessions).insert(pid, Arc::downgrade(self));
        Registration {
            backends: self.backends.clone(),
            pid,
        }
    }

    /// The registry this session is listed in.
    pub fn backends(&self) -> &Arc<Backends> {
        &self.backends
    }

    /// The session's process id, once started.
    pub fn pid(&self) -> Option<i32> {
        self.ident.get().map(|i| i.pid)
    }

    /// Turns true when the session is terminated.
    pub fn terminated(&self) -> watch::Receiver<bool> {
        self.terminate.subscribe()
    }

    /// Set while the running statement waits for its turn.
    pub fn queued(&self) -> &AtomicBool {
        &self.queued
    }

    /// The running statement produced `n` more rows.
    pub fn count_rows(&self, n: usize) {
        self.rows.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Queues a notice (a WARNING) for the client, sent after the statement's response.
    pub fn notice(&self, info: ErrorInfo) {
        lock(&self.notices).push(info);
    }

    /// Queues the notices raised for the client (sent with the statement's response).
    pub async fn send_notices<C>(&self, client: &mut C) -> PgWireResult<()>
    where
        C: Sink<PgWireBackendMessage> + Unpin + Send,
        PgWireError: From<C::Error>,
    {
        let notices = std::mem::take(&mut *lock(&self.notices));
        for info in notices {
            client
                .feed(PgWireBackendMessage::NoticeResponse(NoticeResponse::from(
                    info,
                )))
                .await?;
        }
        Ok(())
    }

    /// A statement (a simple-query message, or an Execute) starts, with its text.
    pub fn begin(&self, text: &str, meta: &HashMap<String, String>) -> Statement<'_> {
        let now = SystemTime::now();
        self.rows.store(0, Ordering::Relaxed);
        lock(&self.notices).clear();
        let mut state = lock(&self.state);
        state.application_name = application_name(meta);
        state.active = true;
        state.query = truncated(text);
        state.query_start = Some(now);
        state.state_change = Some(now);
        if state.xact_start.is_none() {
            state.xact_start = Some(now);
        }
        Statement {
            backend: self,
            started: Instant::now(),
            ended: false,
        }
    }

    /// The row of `pg_stat_activity`, once the session started.
    fn activity(&self) -> Option<Activity> {
        let ident = self.ident.get()?;
        let state = lock(&self.state);
        let name = match (state.active, state.block) {
            (true, _) => "active",
            (false, Block::None) => "idle",
            (false, Block::Open) => "idle in transaction",
            (false, Block::Failed) => "idle in transaction (aborted)",
        };
        Some(Activity {
            pid: ident.pid,
            database: ident.database.clone(),
            user: ident.user.clone(),
            application_name: state.application_name.clone(),
            client: ident.client,
            backend_start: ident.started,
            xact_start: state.xact_start,
            query_start: state.query_start,
            state_change: state.state_change,
            state: name,
            queued: state.active && self.queued.load(Ordering::Relaxed),
            query: state.query.clone(),
            visible: true,
        })
    }
}

fn application_name(meta: &HashMap<String, String>) -> String {
    meta.get(METADATA_APPLICATION_NAME)
        .cloned()
        .unwrap_or_default()
}

/// A running statement of a session; idle again when ended (or dropped, should the
/// connection go away mid-statement).
pub struct Statement<'a> {
    backend: &'a Backend,
    started: Instant,
    ended: bool,
}

impl Statement<'_> {
    /// The statement ended (`ok`: without an error), leaving the transaction `status`: the
    /// session is idle (in a transaction block or not), and the statement is logged if it
    /// took at least `log_min_duration`.
    pub fn end(mut self, status: TransactionStatus, meta: &HashMap<String, String>, ok: bool) {
        self.ended = true;
        let took = self.started.elapsed();
        let block = match status {
            TransactionStatus::Idle => Block::None,
            TransactionStatus::Transaction => Block::Open,
            TransactionStatus::Error => Block::Failed,
        };
        let query = {
            let mut state = lock(&self.backend.state);
            state.application_name = application_name(meta);
            state.active = false;
            state.block = block;
            state.state_change = Some(SystemTime::now());
            if block == Block::None {
                state.xact_start = None;
            }
            self.backend
                .backends
                .log_min_duration
                .filter(|min| took >= *min)
                .map(|_| state.query.clone())
        };
        if let Some(statement) = query {
            let ident = self.backend.ident.get();
            tracing::info!(
                pid = ident.map_or(0, |i| i.pid),
                user = %ident.map(|i| i.user.as_str()).unwrap_or_default(),
                duration_ms = took.as_millis() as u64,
                rows = self.backend.rows.load(Ordering::Relaxed),
                ok,
                statement = ?statement,
                "statement took at least skippr.query.log_min_duration"
            );
        }
    }
}

impl Drop for Statement<'_> {
    fn drop(&mut self) {
        if !self.ended {
            let mut state = lock(&self.backend.state);
            state.active = false;
            state.state_change = Some(SystemTime::now());
        }
    }
}

/// The text of the statement in the portal an Execute names (as it was planned: bound
/// parameters are placeholders, never their values).
pub fn portal_text<C>(client: &C, portal: Option<&str>) -> String
where
    C: ClientPortalStore,
    C::PortalStore: PortalStore<Statement = Stmt>,
{
    client
        .portal_store()
        .get_portal(portal.unwrap_or(DEFAULT_NAME))
        .map(|p| p.statement.statement.0.clone())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(user: &str) -> HashMap<String, String> {
        HashMap::from([
            ("user".to_string(), user.to_string()),
            ("database".to_string(), "skippr".to_string()),
            ("application_name".to_string(), "psql".to_string()),
        ])
    }

    fn session(backends: &Arc<Backends>, pid: i32, user: &str) -> (Arc<Backend>, Registration) {
        let b = Backend::new(backends.clone(), Arc::new(Interrupts::default()));
        let r = b.register(pid, &meta(user), None);
        (b, r)
    }

    #[test]
    fn a_session_shows_its_statement_while_it_runs_then_idles() {
        let backends = Backends::new(HashSet::new(), true, None);
        let (b, registration) = session(&backends, 100_001, "ann");
        let row = |b: &Backends| b.snapshot(None).pop().map(|a| (a.state, a.query, a.queued));
        assert_eq!(row(&backends), Some(("idle", String::new(), false)));
        let running = b.begin("SELECT 1", &meta("ann"));
        b.queued().store(true, Ordering::Relaxed);
        assert_eq!(row(&backends), Some(("active", "SELECT 1".into(), true)));
        b.queued().store(false, Ordering::Relaxed);
        running.end(TransactionStatus::Transaction, &meta("ann"), true);
        assert_eq!(
            row(&backends),
            Some(("idle in transaction", "SELECT 1".into(), false))
        );
        let snapshot = backends.snapshot(None);
        assert!(snapshot[0].xact_start.is_some());
        drop(b.begin("COMMIT", &meta("ann")));
        assert_eq!(row(&backends).map(|r| r.0), Some("idle in transaction"));
        drop(registration);
        assert!(
            backends.snapshot(None).is_empty(),
            "gone with its connection"
        );
    }

    #[test]
    fn long_statements_are_cut() {
        let long = "é".repeat(QUERY_TEXT_LIMIT + 10);
        assert_eq!(truncated(&long).chars().count(), QUERY_TEXT_LIMIT);
        assert_eq!(truncated("SELECT 1"), "SELECT 1");
    }

    #[tokio::test]
    async fn only_the_same_user_or_an_admin_may_signal() {
        let backends = Backends::new(HashSet::from(["root".to_string()]), false, None);
        let (ann, _a) = session(&backends, 7, "ann");
        let (bob, _b) = session(&backends, 8, "bob");
        let (ann2, _a2) = session(&backends, 9, "ann");
        let (root, _r) = session(&backends, 10, "root");
        let seen = |viewer: &Backend| -> Vec<(i32, bool)> {
            let rows = backends.snapshot(Some(viewer));
            rows.iter().map(|a| (a.pid, a.visible)).collect()
        };
        assert_eq!(
            seen(&bob),
            vec![(7, false), (8, true), (9, false), (10, false)]
        );
        assert_eq!(
            seen(&ann),
            vec![(7, true), (8, false), (9, true), (10, false)]
        );
        assert!(seen(&root).iter().all(|(_, visible)| *visible));
        let refused = backends.signal(&bob, 7, Signal::Cancel);
        assert_eq!(
            refused.err().map(|e| (e.code, e.message)),
            Some((
                sqlstate::INSUFFICIENT_PRIVILEGE,
                "permission denied to cancel query".to_string()
            ))
        );
        let refused = backends.signal(&bob, 7, Signal::Terminate);
        assert_eq!(
            refused.err().map(|e| e.message),
            Some("permission denied to terminate process".to_string())
        );
        assert!(matches!(
            backends.signal(&ann2, 7, Signal::Cancel),
            Ok(Some(_))
        ));
        let mut terminated = ann.terminated();
        assert!(matches!(
            backends.signal(&root, 7, Signal::Terminate),
            Ok(Some(_))
        ));
        assert!(*terminated.borrow_and_update());
        // An unknown pid: false, with Postgres's WARNING for the caller.
        assert!(matches!(
            backends.signal(&bob, 4242, Signal::Cancel),
            Ok(None)
        ));
        let notices = std::mem::take(&mut *lock(&bob.notices));
        assert_eq!(
            notices
                .iter()
                .map(|n| n.message.as_str())
                .collect::<Vec<_>>(),
            vec!["PID 4242 is not a PostgreSQL backend process"]
        );
        // Without users (trust), everyone is the same user.
        let trusted = Backends::new(HashSet::new(), true, None);
        let (x, _x) = session(&trusted, 1, "x");
        let (y, _y) = session(&trusted, 2, "y");
        assert!(matches!(
            trusted.signal(&y, 1, Signal::Terminate),
            Ok(Some(_))
        ));
        assert!(trusted.wait_gone(3, Duration::from_millis(1)));
        assert!(!trusted.wait_gone(1, Duration::from_millis(20)));
        drop(x);
    }

    #[tokio::test]
    async fn a_cancel_stops_the_targets_running_statement() {
        let backends = Backends::new(HashSet::new(), true, None);
        let interrupts = Arc::new(Interrupts::default());
        let target = Backend::new(backends.clone(), interrupts.clone());
        let _t = target.register(5, &meta("ann"), None);
        let (caller, _c) = session(&backends, 6, "ann");
        let running = interrupts.begin(None);
        assert!(matches!(
            backends.signal(&caller, 5, Signal::Cancel),
            Ok(Some(_))
        ));
        let why = tokio::time::timeout(Duration::from_secs(5), interrupts.interrupted()).await;
        assert_eq!(why.ok(), Some(super::super::limits::Interruption::Cancel));
        drop(running);
    }
}
