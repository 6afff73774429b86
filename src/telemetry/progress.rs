//! The terminal progress line of the change stream: while a pipeline is behind its source by
//! more than a moment, one line on stderr shows changes per second and how much WAL is left;
//! it clears itself once the stream has caught up. Nothing is drawn when stderr is not a
//! terminal (logs and CI stay clean; the same numbers are in the metrics and `skipprd status`).

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use crate::change::Lsn;

/// Behind by less than this is "caught up" (a busy source is always a little behind).
const SHOW_ABOVE_BYTES: u64 = 4 << 20;
/// The line is redrawn at most this often.
const REDRAW: Duration = Duration::from_millis(250);
/// Rates are measured over windows of about this length.
const RATE_WINDOW: Duration = Duration::from_secs(2);

pub struct CatchUp {
    bar: Option<indicatif::ProgressBar>,
    pipeline: String,
    last_draw: Instant,
    window_start: Instant,
    window_changes: u64,
    rate: f64,
}

impl CatchUp {
    pub fn new(pipeline: &str) -> Self {
        let now = Instant::now();
        Self {
            bar: None,
            pipeline: pipeline.to_string(),
            last_draw: now,
            window_start: now,
            window_changes: 0,
            rate: 0.0,
        }
    }

    /// A source transaction with `changes` row changes ended at `received`; the server's WAL
    /// reaches `server_end`.
    pub fn on_commit(&mut self, changes: u64, received: Lsn, server_end: Lsn) {
        self.window_changes += changes;
        let now = Instant::now();
        let span = now.duration_since(self.window_start);
        if span >= RATE_WINDOW {
            self.rate = self.window_changes as f64 / span.as_secs_f64();
            self.window_start = now;
            self.window_changes = 0;
        }
        if now.duration_since(self.last_draw) < REDRAW {
            return;
        }
        self.last_draw = now;
        self.draw(server_end.0.saturating_sub(received.0));
    }

    /// The server reports its WAL end while nothing is pending: caught up.
    pub fn caught_up(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }

    fn draw(&mut self, behind: u64) {
        if behind < SHOW_ABOVE_BYTES {
            self.caught_up();
            return;
        }
        if self.bar.is_none() && std::io::stderr().is_terminal() {
            let bar = indicatif::ProgressBar::new_spinner();
            bar.set_prefix(self.pipeline.clone());
            if let Ok(style) =
                indicatif::ProgressStyle::with_template("{prefix}: catching up {spinner} {msg}")
            {
                bar.set_style(style);
            }
            self.bar = Some(bar);
        }
        if let Some(bar) = &self.bar {
            bar.set_message(line(self.rate, behind));
            bar.tick();
        }
    }
}

impl Drop for CatchUp {
    fn drop(&mut self) {
        self.caught_up();
    }
}

/// "12345 changes/s, 1.20 GiB of source WAL left".
fn line(rate: f64, behind: u64) -> String {
    let left = indicatif::HumanBytes(behind);
    format!(
        "{} changes/s, {left} of source WAL left",
        rate.round() as u64
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_names_rate_and_what_is_left() {
        assert_eq!(
            line(1234.4, 3 << 30),
            "1234 changes/s, 3.00 GiB of source WAL left"
        );
    }

    #[test]
    fn nothing_is_drawn_off_a_terminal_or_when_caught_up() {
        let mut p = CatchUp::new("app");
        p.draw(1 << 30);
        // The tests' stderr is a pipe: no bar.
        assert!(p.bar.is_none() || std::io::stderr().is_terminal());
        p.draw(0);
        assert!(p.bar.is_none());
    }
}
