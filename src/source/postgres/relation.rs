//! Completes a relation message from the source's catalog when it arrives in the change
//! stream: each column's storage type and type name, its number (`attnum`), whether old rows
//! show a default, and NOT NULL. The result goes into the WAL with the relation, so nothing
//! downstream ever asks the source about the past.
//!
//! # What is guaranteed, given that the catalog is read later than Postgres wrote the change
//!
//! The stream may lag, so the catalog can already show DDL that came after the change.
//! - **Types are exact.** They are resolved by the type oid the message carries, and an oid
//!   never changes meaning (a domain keeps its base type, an enum only gains labels); only
//!   `ALTER TYPE ... RENAME` can change the name used for a sibling column. A type dropped
//!   since is an error (fail closed), never a guess.
//! - **Column numbers are exact or unknown.** A message column is matched with the catalog
//!   column of the same name *and* declared type. The columns in between such anchors are
//!   matched by position only when the catalog has exactly as many columns (live or dropped)
//!   in that stretch of numbers as the message has, which then proves the match (numbers only
//!   grow, and the message lists columns in number order). Otherwise the number is left
//!   unknown, and the sink refuses to guess between a rename and a drop-and-add.
//!   Not detected: a column dropped or renamed away and replaced by a different column of the
//!   same name and type before the stream read the change.
//! - **Default and NOT NULL are as of the catalog read**, or unknown for a column dropped
//!   since: use them to warn and to relax a schema, never to tighten one.

use tokio_postgres::Client;

use super::pgoutput::{RawColumn, RelationMessage};
use super::schema::type_info;
use crate::change::{RelColumn, Relation, TypeInfo};
use crate::error::{Context, Error, Result};

/// One row of `pg_attribute` (live or dropped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    pub attnum: i16,
    pub name: String,
    pub type_oid: u32,
    pub typmod: i32,
    pub dropped: bool,
    pub has_default: bool,
    pub not_null: bool,
}

const ATTRS_SQL: &str = "
SELECT a.attnum, a.attname::text, a.atttypid, a.atttypmod, a.attisdropped,
       a.atthasdef OR a.atthasmissing, a.attnotnull
FROM pg_attribute a
WHERE a.attrelid = $1 AND a.attnum > 0
ORDER BY a.attnum";

// Each (oid, typmod) resolved through domains (an outer typmod wins over a domain's); arrays
// expose their element. One row per input position; a type that no longer exists has none.
const TYPES_SQL: &str = "
WITH RECURSIVE input AS (
  SELECT * FROM unnest($1::oid[], $2::int4[]) WITH ORDINALITY AS i(oid, tmod, ord)
), t AS (
  SELECT i.ord, i.oid AS tid, i.tmod, 0 AS depth FROM input i
  UNION ALL
  SELECT t.ord, p.typbasetype, CASE WHEN t.tmod = -1 THEN p.typtypmod ELSE t.tmod END, t.depth + 1
  FROM t JOIN pg_type p ON p.oid = t.tid WHERE p.typtype = 'd' AND t.depth < 16
)
SELECT DISTINCT ON (t.ord) t.ord, t.tid, t.tmod, p.typtype::text, e.oid, e.typtype::text,
       d.typname::text
FROM t
JOIN input i ON i.ord = t.ord
JOIN pg_type d ON d.oid = i.oid
JOIN pg_type p ON p.oid = t.tid
LEFT JOIN pg_type e ON e.oid = p.typelem AND p.typcategory = 'A'
ORDER BY t.ord, t.depth DESC";

/// Resolves a relation message against the catalog as it is now (see the module docs for
/// what that guarantees).
pub async fn resolve(client: &Client, msg: RelationMessage) -> Result<Relation> {
    let table = format!("{}.{}", msg.namespace, msg.name);
    let attrs: Vec<Attr> = client
        .query(ATTRS_SQL, &[&msg.id])
        .await
        .with_context(|| format!("reading the columns of table {table} for its relation message"))?
        .iter()
        .map(|r| Attr {
            attnum: r.get(0),
            name: r.get(1),
            type_oid: r.get(2),
            typmod: r.get(3),
            dropped: r.get(4),
            has_default: r.get(5),
            not_null: r.get(6),
        })
        .collect();
    let oids: Vec<u32> = msg.columns.iter().map(|c| c.type_oid).collect();
    let mods: Vec<i32> = msg.columns.iter().map(|c| c.typmod).collect();
    let mut types: Vec<Option<(TypeInfo, String)>> = vec![None; msg.columns.len()];
    for row in client
        .query(TYPES_SQL, &[&oids, &mods])
        .await
        .with_context(|| format!("resolving the column types of table {table}"))?
    {
        let ord: i64 = row.get(0);
        if let Some(slot) = usize::try_from(ord - 1).ok().and_then(|i| types.get_mut(i)) {
            *slot = Some((type_info(&row, 1), row.get(6)));
        }
    }
    let matched = match_columns(&msg.columns, &attrs);
    let unknown = matched.iter().filter(|m| m.is_none()).count();
    if unknown > 0 {
        tracing::info!(table = %table, columns = unknown, "the source's catalog changed since this part of the stream was written: some columns cannot be identified by number (renames among them will stop the sink rather than be guessed)");
    }
    let mut columns = Vec::with_capacity(msg.columns.len());
    for ((c, m), t) in msg.columns.into_iter().zip(matched).zip(types) {
        let Some((storage, type_name)) = t else {
            return Err(Error::source_err(format!(
                "column `{}` of table {table} has type oid {}, which no longer exists in the source (dropped after the change was written, before skipprd read it): its values cannot be typed. Run `skipprd sync --resnapshot` to copy the table as it is now",
                c.name, c.type_oid
            )));
        };
        let attr = m.and_then(|i| attrs.get(i));
        let live = attr.filter(|a| !a.dropped);
        columns.push(RelColumn {
            is_key: c.is_key,
            name: c.name,
            type_oid: c.type_oid,
            typmod: c.typmod,
            type_name,
            storage,
            attnum: attr.map(|a| a.attnum),
            has_default: live.map(|a| a.has_default),
            not_null: live.map(|a| a.not_null),
        });
    }
    Ok(Relation {
        id: msg.id,
        namespace: msg.namespace,
        name: msg.name,
        replica_identity: msg.replica_identity,
        columns,
    })
}

/// For each message column, the catalog row that provably is that column (see the module
/// docs), or `None`.
pub fn match_columns(cols: &[RawColumn], attrs: &[Attr]) -> Vec<Option<usize>> {
    let mut out: Vec<Option<usize>> = cols
        .iter()
        .map(|c| {
            attrs.iter().position(|a| {
                !a.dropped && a.name == c.name && a.type_oid == c.type_oid && a.typmod == c.typmod
            })
        })
        .collect();
    let anchors: Vec<i16> = out.iter().flatten().map(|&i| attrs[i].attnum).collect();
    if anchors.windows(2).any(|w| w[0] >= w[1]) {
        // Out of order: the catalog is not the one these columns came from.
        return vec![None; cols.len()];
    }
    let mut i = 0;
    while i < cols.len() {
        if out[i].is_some() {
            i += 1;
            continue;
        }
        let start = i;
        while i < cols.len() && out[i].is_none() {
            i += 1;
        }
        let lo = start
            .checked_sub(1)
            .and_then(|p| out[p])
            .map_or(0, |a| i32::from(attrs[a].attnum));
        let hi = out
            .get(i)
            .copied()
            .flatten()
            .map_or(i32::MAX, |a| i32::from(attrs[a].attnum));
        let between: Vec<usize> = attrs
            .iter()
            .enumerate()
            .filter(|(_, a)| (lo + 1..hi).contains(&i32::from(a.attnum)))
            .map(|(k, _)| k)
            .collect();
        if between.len() == i - start {
            for (k, a) in between.into_iter().enumerate() {
                out[start + k] = Some(a);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(name: &str, oid: u32) -> RawColumn {
        RawColumn {
            is_key: false,
            name: name.into(),
            type_oid: oid,
            typmod: -1,
        }
    }

    fn attr(attnum: i16, name: &str, oid: u32) -> Attr {
        Attr {
            attnum,
            name: name.into(),
            type_oid: oid,
            typmod: -1,
            dropped: false,
            has_default: false,
            not_null: false,
        }
    }

    fn dropped(attnum: i16) -> Attr {
        Attr {
            name: format!("........pg.dropped.{attnum}........"),
            type_oid: 0,
            dropped: true,
            ..attr(attnum, "", 0)
        }
    }

    fn numbers(cols: &[RawColumn], attrs: &[Attr]) -> Vec<Option<i16>> {
        match_columns(cols, attrs)
            .into_iter()
            .map(|m| m.map(|i| attrs[i].attnum))
            .collect()
    }

    #[test]
    fn an_unchanged_catalog_matches_every_column() {
        let cols = [col("id", 23), col("v", 25)];
        let attrs = [attr(1, "id", 23), dropped(2), attr(3, "v", 25)];
        assert_eq!(numbers(&cols, &attrs), vec![Some(1), Some(3)]);
    }

    #[test]
    fn a_column_renamed_later_is_found_by_position_when_that_is_certain() {
        // The message still says `b`; the catalog already calls attnum 2 `c`.
        let cols = [col("a", 23), col("b", 25), col("z", 23)];
        let attrs = [attr(1, "a", 23), attr(2, "c", 25), attr(3, "z", 23)];
        assert_eq!(numbers(&cols, &attrs), vec![Some(1), Some(2), Some(3)]);
        // Dropped later: its number is still there, as a dropped column.
        let attrs = [attr(1, "a", 23), dropped(2), attr(3, "z", 23)];
        assert_eq!(numbers(&cols, &attrs), vec![Some(1), Some(2), Some(3)]);
    }

    #[test]
    fn a_type_changed_later_keeps_the_number() {
        let cols = [col("id", 23), col("n", 23)];
        let attrs = [attr(1, "id", 23), attr(2, "n", 20)];
        assert_eq!(numbers(&cols, &attrs), vec![Some(1), Some(2)]);
    }

    #[test]
    fn ambiguous_stretches_stay_unknown() {
        // `b` was renamed or dropped later, and a column was added after it: the last
        // stretch has two candidates for one column.
        let cols = [col("a", 23), col("b", 25)];
        let attrs = [attr(1, "a", 23), attr(2, "c", 25), attr(3, "d", 25)];
        assert_eq!(numbers(&cols, &attrs), vec![Some(1), None]);
        // A dropped column before the message was written also counts: unknown.
        let cols = [col("a", 23), col("b", 25), col("z", 23)];
        let attrs = [
            attr(1, "a", 23),
            dropped(2),
            attr(3, "c", 25),
            attr(4, "z", 23),
        ];
        assert_eq!(numbers(&cols, &attrs), vec![Some(1), None, Some(4)]);
        // The table is gone: nothing is known.
        assert_eq!(numbers(&cols, &[]), vec![None, None, None]);
    }

    #[test]
    fn anchors_out_of_order_mean_nothing_is_certain() {
        let cols = [col("a", 23), col("b", 23)];
        let attrs = [attr(1, "b", 23), attr(2, "a", 23)];
        assert_eq!(numbers(&cols, &attrs), vec![None, None]);
    }
}
