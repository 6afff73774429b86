//! Config, the first pass over the YAML: `${VAR}` references filled from the environment,
//! and the text deserialized into the file's types with every type problem collected at its
//! path (not only the first).

use serde_yaml::Value;

use super::is_simple_name;
use super::locate::Segment;

/// Deserializes `value` into `T`, collecting every type problem: after each one the
/// offending entry is set aside and the rest is checked again.
pub(super) fn typed_all<T: serde::de::DeserializeOwned>(
    value: &Value,
) -> (Option<T>, Vec<(Vec<Segment>, String)>) {
    let mut v = value.clone();
    let mut problems: Vec<(Vec<Segment>, String)> = Vec::new();
    for _ in 0..64 {
        match typed::<T>(&v) {
            Ok(t) => return (Some(t), problems),
            Err((path, msg)) => {
                let missing = msg.starts_with("missing required field");
                // A required field we set aside is not a second problem.
                let ours = missing
                    && problems
                        .iter()
                        .any(|(p, _)| p.len() == path.len() + 1 && p.starts_with(&path));
                if !ours {
                    problems.push((path.clone(), msg));
                }
                if missing || !remove_at(&mut v, &path) {
                    return (None, problems);
                }
            }
        }
    }
    (None, problems)
}

/// Removes the entry at `path`; false when there is nothing to remove.
fn remove_at(v: &mut Value, path: &[Segment]) -> bool {
    let Some((last, parents)) = path.split_last() else {
        return false;
    };
    let mut cur = v;
    for seg in parents {
        cur = match (seg, cur) {
            (Segment::Key(k), Value::Mapping(m)) => match m.get_mut(k.as_str()) {
                Some(next) => next,
                None => return false,
            },
            (Segment::Index(i), Value::Sequence(s)) => match s.get_mut(*i) {
                Some(next) => next,
                None => return false,
            },
            _ => return false,
        };
    }
    match (last, cur) {
        (Segment::Key(k), Value::Mapping(m)) => m.remove(k.as_str()).is_some(),
        (Segment::Index(i), Value::Sequence(s)) if *i < s.len() => {
            s.remove(*i);
            true
        }
        _ => false,
    }
}

/// Deserializes a value into `T`, returning the failing path and a readable message.
fn typed<T: serde::de::DeserializeOwned>(value: &Value) -> Result<T, (Vec<Segment>, String)> {
    serde_path_to_error::deserialize(value.clone()).map_err(|e| {
        let mut path: Vec<Segment> = e
            .path()
            .iter()
            .filter_map(|s| match s {
                serde_path_to_error::Segment::Map { key } => Some(Segment::Key(key.clone())),
                serde_path_to_error::Segment::Seq { index } => Some(Segment::Index(*index)),
                serde_path_to_error::Segment::Enum { variant } => {
                    Some(Segment::Key(variant.clone()))
                }
                serde_path_to_error::Segment::Unknown => None,
            })
            .collect();
        let inner = e.into_inner().to_string();
        let message = improve_message(&inner);
        // For an unknown field, point at the field itself.
        if let Some(field) = inner
            .strip_prefix("unknown field `")
            .and_then(|r| r.split('`').next())
        {
            if path.last() != Some(&Segment::Key(field.to_string())) {
                path.push(Segment::Key(field.to_string()));
            }
        }
        (path, message)
    })
}

/// Rewrites serde's wording into the words of the config file.
fn improve_message(msg: &str) -> String {
    let msg = msg
        .replace("unknown variant", "unknown value")
        .replace("invalid type: ", "wrong type: found ")
        .replace("u16", "a port number (1-65535)")
        .replace("usize", "a positive integer")
        .replace("u64", "a positive integer");
    let msg = msg.replace("expected one of ", "expected one of: ");
    match msg.strip_prefix("missing field ") {
        Some(rest) => format!("missing required field {rest}"),
        None => msg,
    }
}

/// Replaces `${VAR}` and `${VAR:-default}` in every string; `$$` is a literal `$`.
pub(super) fn interpolate(
    value: &mut Value,
    path: &mut Vec<Segment>,
    env: &dyn Fn(&str) -> Option<String>,
    report: &mut dyn FnMut(&[Segment], String),
) {
    match value {
        Value::String(s) => match expand(s, env) {
            Ok(Some(new)) => *s = new,
            Ok(None) => {}
            Err(msg) => report(path, msg),
        },
        Value::Sequence(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                path.push(Segment::Index(i));
                interpolate(item, path, env, report);
                path.pop();
            }
        }
        Value::Mapping(map) => {
            for (k, v) in map.iter_mut() {
                let key = match k {
                    Value::String(s) => s.clone(),
                    other => serde_yaml::to_string(other)
                        .unwrap_or_default()
                        .trim()
                        .to_string(),
                };
                path.push(Segment::Key(key));
                interpolate(v, path, env, report);
                path.pop();
            }
        }
        Value::Tagged(t) => interpolate(&mut t.value, path, env, report),
        _ => {}
    }
}

/// Expands one string. `Ok(None)` means it has no reference.
pub fn expand(s: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Option<String>, String> {
    if !s.contains('$') {
        return Ok(None);
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(r) = after.strip_prefix('$') {
            out.push('$');
            rest = r;
        } else if let Some(r) = after.strip_prefix('{') {
            let end = r.find('}').ok_or_else(|| {
                "unterminated `${` reference: write `${NAME}`, or `$$` for a literal `$`"
                    .to_string()
            })?;
            let inner = &r[..end];
            let (name, default) = match inner.split_once(":-") {
                Some((n, d)) => (n, Some(d)),
                None => (inner, None),
            };
            if !is_simple_name(name) {
                return Err(format!(
                    "`${{{inner}}}` is not a valid environment variable reference: use letters, digits and `_`"
                ));
            }
            match (env(name), default) {
                (Some(v), _) => out.push_str(&v),
                (None, Some(d)) => out.push_str(d),
                (None, None) => {
                    return Err(format!(
                        "environment variable `{name}` is not set; export it before running skipprd (or write `${{{name}:-default}}`)"
                    ))
                }
            }
            rest = &r[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(Some(out))
}
