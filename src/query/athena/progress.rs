//! Progress of an Athena query on stderr while `skipprd query --engine athena` waits:
//! state, elapsed time and data scanned.

use std::io::Write;
use std::time::{Duration, Instant};

use super::{State, Status};
pub use crate::telemetry::human_bytes;

/// Progress of one query on stderr: on a terminal one line rewritten in place, otherwise a
/// line per state change and every ten seconds.
pub struct Progress {
    started: Instant,
    terminal: bool,
    last: Option<(State, Instant)>,
    out: Box<dyn std::io::Write + Send>,
}

/// How often a non-terminal progress line repeats while the state stays the same.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

impl Progress {
    pub fn stderr() -> Self {
        use std::io::IsTerminal;
        Self::new(std::io::stderr().is_terminal(), Box::new(std::io::stderr()))
    }

    pub fn new(terminal: bool, out: Box<dyn std::io::Write + Send>) -> Self {
        Self {
            started: Instant::now(),
            terminal,
            last: None,
            out,
        }
    }

    pub fn update(&mut self, id: &str, status: &Status) {
        let now = Instant::now();
        let line = format!(
            "athena: query {id} {} ({:.1} s, {} scanned)",
            status.state.as_str(),
            now.duration_since(self.started).as_secs_f64(),
            human_bytes(status.scanned_bytes)
        );
        let changed = self.last.is_none_or(|(s, _)| s != status.state);
        let due = self
            .last
            .is_none_or(|(_, at)| now.duration_since(at) >= PROGRESS_EVERY);
        // Progress is best effort: a closed stderr must not fail the query.
        if self.terminal {
            let end = if status.state.is_final() { "\n" } else { "" };
            let _ = write!(self.out, "\r\x1b[2K{line}{end}");
            let _ = self.out.flush();
        } else if changed || due {
            let _ = writeln!(self.out, "{line}");
        }
        if changed || due {
            self.last = Some((status.state, now));
        }
    }

    /// Ends a line left open on a terminal (an error or an interrupt came before a final
    /// state), so that what is printed next starts on its own line.
    pub fn finish(&mut self) {
        if self.terminal && self.last.is_some_and(|(s, _)| !s.is_final()) {
            let _ = writeln!(self.out);
            self.last = None;
        }
    }
}
