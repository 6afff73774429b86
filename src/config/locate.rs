//! Source positions for `skippr.yml`: maps a field path such as
//! `data_sources.app_db.Postgres.port` to the line and column where it is written, so that
//! every configuration error can point at the exact spot.

use std::collections::HashMap;

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::Marker;

/// One step of a field path.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Segment {
    Key(String),
    Index(usize),
}

/// Formats a path as users write it: `a.b[2].c`.
pub fn display_path(path: &[Segment]) -> String {
    let mut out = String::new();
    for seg in path {
        match seg {
            Segment::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Segment::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// A line and a column, both 1-based.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub line: usize,
    pub column: usize,
}

/// Positions of every key and sequence item of a YAML document.
#[derive(Debug, Default)]
pub struct Locator {
    positions: HashMap<String, Position>,
}

impl Locator {
    /// Scans `text`; a syntax error yields its position and message.
    pub fn scan(text: &str) -> Result<Self, (Position, String)> {
        let mut builder = Builder::default();
        let mut parser = Parser::new_from_str(text);
        parser.load(&mut builder, false).map_err(|e| {
            let m = e.marker();
            (
                Position {
                    line: m.line(),
                    column: m.col() + 1,
                },
                e.info().to_string(),
            )
        })?;
        Ok(Self {
            positions: builder.positions,
        })
    }

    /// The position of `path`, or of its nearest ancestor that is written in the file.
    pub fn find(&self, path: &[Segment]) -> Option<Position> {
        let mut len = path.len();
        loop {
            if let Some(p) = self.positions.get(&display_path(&path[..len])) {
                return Some(*p);
            }
            if len == 0 {
                return None;
            }
            len -= 1;
        }
    }
}

enum Frame {
    Map { key: Option<String> },
    Seq { next: usize },
}

#[derive(Default)]
struct Builder {
    stack: Vec<Frame>,
    path: Vec<Segment>,
    positions: HashMap<String, Position>,
}

impl Builder {
    /// Called when a value (scalar or collection) starts: works out its path segment.
    fn enter_value(&mut self, mark: Marker) -> bool {
        let seg = match self.stack.last_mut() {
            Some(Frame::Map { key }) => match key.take() {
                Some(k) => Segment::Key(k),
                None => return false,
            },
            Some(Frame::Seq { next }) => {
                let i = *next;
                *next += 1;
                Segment::Index(i)
            }
            None => return false,
        };
        self.path.push(seg);
        let pos = Position {
            line: mark.line(),
            column: mark.col() + 1,
        };
        self.positions
            .entry(display_path(&self.path))
            .or_insert(pos);
        true
    }
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        match ev {
            Event::Scalar(value, ..) => {
                // A scalar in key position names the next value; remember where the key is.
                if let Some(Frame::Map { key }) = self.stack.last_mut() {
                    if key.is_none() {
                        *key = Some(value.clone());
                        let mut p = self.path.clone();
                        p.push(Segment::Key(value));
                        self.positions.entry(display_path(&p)).or_insert(Position {
                            line: mark.line(),
                            column: mark.col() + 1,
                        });
                        return;
                    }
                }
                if self.enter_value(mark) {
                    self.path.pop();
                }
            }
            Event::Alias(_) if self.enter_value(mark) => {
                self.path.pop();
            }
            Event::MappingStart(..) | Event::SequenceStart(..) => {
                let entered = self.enter_value(mark);
                if !entered && !self.stack.is_empty() {
                    // A complex key: not used by skippr.yml; keep the stack balanced.
                    self.path.push(Segment::Key(String::from("?")));
                }
                let top_level = self.stack.is_empty();
                self.stack.push(if matches!(ev, Event::MappingStart(..)) {
                    Frame::Map { key: None }
                } else {
                    Frame::Seq { next: 0 }
                });
                if top_level {
                    // The document root has no segment of its own.
                }
            }
            Event::MappingEnd | Event::SequenceEnd => {
                self.stack.pop();
                if !self.stack.is_empty() {
                    self.path.pop();
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(parts: &[&str]) -> Vec<Segment> {
        parts.iter().map(|p| Segment::Key(p.to_string())).collect()
    }

    #[test]
    fn finds_nested_keys_and_items() {
        let text = "skippr:\n  workspace: a\ndata_sources:\n  db:\n    Postgres:\n      tables: [x, y]\n      port: 5\n";
        let loc = Locator::scan(text).unwrap();
        assert_eq!(loc.find(&key(&["skippr", "workspace"])).unwrap().line, 2);
        assert_eq!(
            loc.find(&key(&["data_sources", "db", "Postgres", "port"]))
                .unwrap()
                .line,
            7
        );
        let mut p = key(&["data_sources", "db", "Postgres", "tables"]);
        p.push(Segment::Index(1));
        assert_eq!(loc.find(&p).unwrap().line, 6);
        // Unknown leaf falls back to the nearest ancestor.
        assert_eq!(
            loc.find(&key(&["data_sources", "db", "Postgres", "nope"]))
                .unwrap()
                .line,
            5
        );
    }

    #[test]
    fn syntax_error_has_position() {
        let err = Locator::scan("a: [1, 2\nb: c\n").unwrap_err();
        assert!(err.0.line >= 1);
    }
}
