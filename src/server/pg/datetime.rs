//! Gateway, Postgres imitation, date and time formats: `to_timestamp(text, format)` and
//! `to_date(text, format)` take Postgres's template patterns (`YYYY-MM-DD HH24:MI:SS.US`,
//! which Superset's time filters send); the engine's functions of the same names take
//! strftime's. A literal template is translated before planning.

use datafusion::sql::sqlparser::ast::{
    Expr, Function, FunctionArg, FunctionArgExpr, FunctionArguments, Value, ValueWithSpan,
};

/// Translates the template of a `to_timestamp(text, template)` or `to_date(text, template)`
/// call given as a literal; returns whether it did.
pub fn translate_call(f: &mut Function) -> bool {
    let name = f.name.to_string().to_ascii_lowercase();
    let name = name.trim_start_matches("pg_catalog.");
    if name != "to_timestamp" && name != "to_date" {
        return false;
    }
    let FunctionArguments::List(list) = &mut f.args else {
        return false;
    };
    let [_, FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::Value(ValueWithSpan {
        value: Value::SingleQuotedString(template),
        ..
    })))] = list.args.as_mut_slice()
    else {
        return false;
    };
    match strftime_of(template) {
        Some(format) => {
            *template = format;
            true
        }
        None => false,
    }
}

/// The strftime format equal to Postgres's template `template`, or `None` when the template
/// uses a pattern without an equal (the call is then left to the engine as written).
pub fn strftime_of(template: &str) -> Option<String> {
    // Longest patterns first: `HH24` before `HH`, `YYYY` before `YY`, `Month` before `Mon`.
    const PATTERNS: &[(&str, &str)] = &[
        ("YYYY", "%Y"),
        ("HH24", "%H"),
        ("HH12", "%I"),
        ("MONTH", "%B"),
        ("DDD", "%j"),
        ("MON", "%b"),
        ("DAY", "%A"),
        ("YY", "%y"),
        ("MM", "%m"),
        ("DD", "%d"),
        ("HH", "%I"),
        ("MI", "%M"),
        ("SS", "%S"),
        ("MS", "%3f"),
        ("US", "%6f"),
        ("AM", "%p"),
        ("PM", "%p"),
        ("DY", "%a"),
        ("TZ", "%Z"),
        ("OF", "%:z"),
    ];
    let mut out = String::new();
    let mut rest = template;
    while let Some(c) = rest.chars().next() {
        // A fraction after a literal dot: any number of digits, as Postgres reads it.
        let upper = rest.to_ascii_uppercase();
        if upper.starts_with(".US") || upper.starts_with(".MS") {
            out.push_str("%.f");
            rest = &rest[3..];
            continue;
        }
        if let Some((p, f)) = PATTERNS.iter().find(|(p, _)| upper.starts_with(p)) {
            out.push_str(f);
            rest = &rest[p.len()..];
            continue;
        }
        match c {
            '"' => {
                // Quoted text is literal.
                let end = rest[1..].find('"')? + 1;
                out.push_str(&rest[1..end].replace('%', "%%"));
                rest = &rest[end + 1..];
            }
            '%' => {
                out.push_str("%%");
                rest = &rest[1..];
            }
            c if c.is_ascii_alphanumeric() => return None,
            c => {
                out.push(c);
                rest = &rest[c.len_utf8()..];
            }
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_templates_become_strftime_formats() {
        assert_eq!(
            strftime_of("YYYY-MM-DD HH24:MI:SS.US").as_deref(),
            Some("%Y-%m-%d %H:%M:%S%.f")
        );
        assert_eq!(strftime_of("YYYY-MM-DD").as_deref(), Some("%Y-%m-%d"));
        assert_eq!(
            strftime_of("DD Mon YYYY HH12:MI AM").as_deref(),
            Some("%d %b %Y %I:%M %p")
        );
        assert_eq!(strftime_of("\"at\" HH24%").as_deref(), Some("at %H%%"));
        assert_eq!(strftime_of("YYYY-WW"), None);
    }
}
