//! Keeps docs/operations.md's error table, the catalog of stop errors and the code's messages
//! in step (see the module comment of `stops`).

use super::*;
use std::path::{Path, PathBuf};

const SECTION: &str = "## Errors that stop a pipeline, and what to do";

/// Messages built around a reason made elsewhere (and documented there): their own words are
/// only the table and column names.
const WRAPPERS: &[&str] = &[
    "table {}, column `{}`: {reason}",
    "table {}, column `{}`: {}",
    "{detail}; fix: {fix}",
];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display()));
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// The string literals of a Rust file with their byte offsets (escapes kept as written, which
/// is enough to match words). Comments and char literals are skipped.
fn literals(src: &str) -> Vec<(usize, String)> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'\'' if b.get(i + 2) == Some(&b'\'') => i += 3,
            b'\'' if b.get(i + 1) == Some(&b'\\') && b.get(i + 3) == Some(&b'\'') => i += 4,
            b'"' => {
                let start = i + 1;
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    if b[i] == b'\\' {
                        i += 1;
                    }
                    i += 1;
                }
                out.push((start, src[start..i.min(b.len())].to_string()));
                i += 1;
            }
            _ => i += 1,
        }
    }
    out
}

/// Whether `literal` holds the fragment's pieces (split at `...`) in order.
fn matches(fragment: &str, literal: &str) -> bool {
    let mut rest = literal;
    for piece in fragment
        .split("...")
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        match rest.find(piece) {
            Some(at) => rest = &rest[at + piece.len()..],
            None => return false,
        }
    }
    true
}

struct Source {
    path: PathBuf,
    text: String,
    literals: Vec<(usize, String)>,
}

fn sources() -> Vec<Source> {
    let mut files = Vec::new();
    rust_files(&repo().join("src"), &mut files);
    files
        .into_iter()
        .filter(|p| {
            !p.starts_with(repo().join("src/error/stops")) && !p.ends_with("error/stops.rs")
        })
        // Tests build errors of their own.
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            !(name == "tests.rs"
                || name.ends_with("_tests.rs")
                || p.components().any(|c| c.as_os_str() == "tests"))
        })
        .map(|path| {
            let mut text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
            if let Some(at) = text.find("#[cfg(test)]\nmod tests {") {
                text.truncate(at);
            }
            let literals = literals(&text);
            Source {
                path,
                text,
                literals,
            }
        })
        .collect()
}

#[test]
fn error_table_in_docs_is_rendered_from_the_catalog() {
    let path = repo().join("docs/operations.md");
    let docs = std::fs::read_to_string(&path).expect("docs/operations.md is readable");
    let at = docs
        .find(SECTION)
        .expect("docs/operations.md has the error section");
    let table_start = at + docs[at..].find("\n|").expect("the section has a table") + 1;
    let table_len: usize = docs[table_start..]
        .split_inclusive('\n')
        .take_while(|l| l.starts_with('|'))
        .map(str::len)
        .sum();
    let current = &docs[table_start..table_start + table_len];
    let rendered = render_table();
    if current == rendered {
        return;
    }
    if std::env::var_os("SKIPPR_WRITE_DOCS").is_some() {
        let updated = format!(
            "{}{rendered}{}",
            &docs[..table_start],
            &docs[table_start + table_len..]
        );
        std::fs::write(&path, updated).expect("docs/operations.md is writable");
        return;
    }
    panic!(
        "docs/operations.md's error table differs from src/error/stops.rs; regenerate it with\n  SKIPPR_WRITE_DOCS=1 cargo test error_table\nexpected:\n{rendered}"
    );
}

#[test]
fn error_table_fragments_occur_in_the_code() {
    let sources = sources();
    for e in STOP_ERRORS {
        for fragment in e.says {
            let found = sources
                .iter()
                .any(|s| s.literals.iter().any(|(_, l)| matches(fragment, l)));
            assert!(
                found,
                "docs say `{fragment}`, but no message in src/ holds it: update src/error/stops.rs"
            );
        }
    }
}

#[test]
fn error_table_covers_every_stop_message() {
    let mut missing = Vec::new();
    for s in sources() {
        for call in ["Error::source_err(", "Error::unrepresentable("] {
            for (at, _) in s.text.match_indices(call) {
                let Some((_, literal)) = s.literals.iter().find(|(start, _)| *start > at) else {
                    continue;
                };
                if WRAPPERS.contains(&literal.as_str()) {
                    continue;
                }
                let documented = STOP_ERRORS
                    .iter()
                    .any(|e| e.says.iter().any(|f| matches(f, literal)));
                if !documented {
                    missing.push(format!("{}: {literal}", s.path.display()));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "messages that stop a pipeline but are not in src/error/stops.rs (and so not in docs/operations.md):\n{}",
        missing.join("\n")
    );
}

#[test]
fn fragment_matching_needs_the_pieces_in_order() {
    assert!(matches(
        "slot ... no longer exists",
        "replication slot `{}` no longer exists"
    ));
    assert!(!matches(
        "no longer exists ... slot",
        "replication slot `{}` no longer exists"
    ));
    assert!(!matches("gained column", "table {} lost a column"));
}
