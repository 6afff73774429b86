//! Gateway, Postgres imitation, catalog lookups by oid: `regclass` (relation names to oids
//! and back), `pg_get_viewdef`, `obj_description` and `col_description`, answered from a
//! snapshot of `pg_class`, `pg_views` and `pg_description` taken before a statement that
//! uses them is planned (a function cannot read the catalog while the engine evaluates it).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use arrow::array::{Array, AsArray, Int32Array, StringArray};
use arrow::datatypes::DataType;
use datafusion::error::Result as DfResult;
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDF};
use datafusion::prelude::SessionContext;

use super::catalog::ident;
use super::udf::{self, text};

/// The relations of the catalog by name, for `regclass` casts: a snapshot taken (by
/// [`Relations::refresh`]) before a statement that casts to `regclass` is planned.
#[derive(Debug, Default)]
pub struct RelationNames {
    /// (schema, relation) → oid.
    by_name: HashMap<(String, String), i32>,
    /// oid → (schema, relation).
    by_oid: HashMap<i32, (String, String)>,
    /// Schemas searched for unqualified names, in order.
    search_path: Vec<String>,
    /// View definitions by the view's oid.
    viewdefs: HashMap<i32, String>,
    /// Comments by (object oid, column number; 0 for the object).
    descriptions: HashMap<(i32, i32), String>,
}

/// The functions that read the snapshot (besides the `regclass` casts).
pub const LOOKUPS: &[&str] = &["pg_get_viewdef", "obj_description", "col_description"];

impl RelationNames {
    /// The oid of a relation named as `regclass` input reads it: `name`, `schema.name`, each
    /// part bare (case-folded) or double-quoted.
    pub(crate) fn oid_of(&self, name: &str) -> Option<i32> {
        let parts = parse_name(name)?;
        match parts.as_slice() {
            [rel] => self
                .search_path
                .iter()
                .find_map(|s| self.by_name.get(&(s.clone(), rel.clone())).copied()),
            [schema, rel] | [_, schema, rel] => {
                self.by_name.get(&(schema.clone(), rel.clone())).copied()
            }
            _ => None,
        }
    }

    /// The comment on object `oid` (column `sub`, 0 for the object itself).
    fn description(&self, oid: Option<i64>, sub: Option<i64>) -> Option<String> {
        let key = (i32::try_from(oid?).ok()?, i32::try_from(sub?).ok()?);
        self.descriptions.get(&key).cloned()
    }

    /// How `regclass` output prints a relation: its name, schema-qualified when the schema
    /// is not searched; the number itself for an unknown oid.
    pub(crate) fn name_of(&self, oid: i32) -> String {
        match self.by_oid.get(&oid) {
            Some((schema, rel)) => {
                let visible = self
                    .search_path
                    .iter()
                    .find(|s| self.by_name.contains_key(&((*s).clone(), rel.clone())))
                    .is_some_and(|s| s == schema);
                if visible {
                    ident(rel)
                } else {
                    format!("{}.{}", ident(schema), ident(rel))
                }
            }
            None => oid.to_string(),
        }
    }
}

/// Splits a possibly qualified, possibly quoted name into its parts (bare parts are
/// folded to lower case); `None` when it is malformed.
pub(crate) fn parse_name(name: &str) -> Option<Vec<String>> {
    let mut parts = Vec::new();
    let mut chars = name.trim().chars().peekable();
    loop {
        let mut part = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next()? {
                    '"' if chars.peek() == Some(&'"') => {
                        chars.next();
                        part.push('"');
                    }
                    '"' => break,
                    c => part.push(c),
                }
            }
        } else {
            while let Some(c) = chars.peek().filter(|c| **c != '.') {
                part.push(c.to_ascii_lowercase());
                chars.next();
            }
            part = part.trim().to_string();
        }
        if part.is_empty() {
            return None;
        }
        parts.push(part);
        match chars.next() {
            None => return Some(parts),
            Some('.') => continue,
            Some(_) => return None,
        }
    }
}

/// The shared snapshot of one connection's relation names.
#[derive(Debug, Clone, Default)]
pub struct Relations(Arc<RwLock<RelationNames>>);

impl Relations {
    /// Reads the relations of `pg_class` into the snapshot; unqualified names are then
    /// looked up in `search_path`.
    /// With `descriptions`, view definitions and comments are read too.
    pub async fn refresh(
        &self,
        ctx: &SessionContext,
        search_path: Vec<String>,
        descriptions: bool,
    ) -> DfResult<()> {
        let batches = ctx
            .sql(
                "SELECT c.oid, n.nspname, c.relname \
                 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON c.relnamespace = n.oid",
            )
            .await?
            .collect()
            .await?;
        let mut names = RelationNames {
            search_path,
            ..Default::default()
        };
        for b in batches {
            let oids = arrow::compute::cast(b.column(0), &DataType::Int32)?;
            let oids = oids.as_primitive::<arrow::datatypes::Int32Type>();
            let schemas = text(b.column(1))?;
            let schemas = schemas.as_string::<i32>();
            let rels = text(b.column(2))?;
            let rels = rels.as_string::<i32>();
            for i in 0..b.num_rows() {
                if oids.is_null(i) || schemas.is_null(i) || rels.is_null(i) {
                    continue;
                }
                let key = (schemas.value(i).to_string(), rels.value(i).to_string());
                names.by_oid.insert(oids.value(i), key.clone());
                names.by_name.insert(key, oids.value(i));
            }
        }
        if !descriptions {
            *self.0.write().unwrap_or_else(|e| e.into_inner()) = names;
            return Ok(());
        }
        names.viewdefs = pairs(
            ctx,
            "SELECT CAST(c.oid AS INT), CAST(v.definition AS VARCHAR) \
             FROM pg_catalog.pg_views v \
             JOIN pg_catalog.pg_namespace n ON n.nspname = v.schemaname \
             JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = v.viewname",
        )
        .await?
        .into_iter()
        .map(|(k, _, v)| (k, v))
        .collect();
        names.descriptions = pairs(
            ctx,
            "SELECT CAST(objoid AS INT), CAST(description AS VARCHAR), CAST(objsubid AS INT) \
             FROM pg_catalog.pg_description",
        )
        .await?
        .into_iter()
        .map(|(oid, sub, v)| ((oid, sub), v))
        .collect();
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = names;
        Ok(())
    }

    /// The per-connection functions reading this snapshot: `x::regclass` (the relation's
    /// oid) and `x::regclass::text` (its name). `x` is a relation name (text) or already an
    /// oid (a number). An unknown name gives NULL, like `to_regclass()`.
    pub fn udfs(&self) -> [ScalarUDF; 5] {
        let (oids, names) = (self.clone(), self.clone());
        let (defs, objects, columns) = (self.clone(), self.clone(), self.clone());
        [
            // `pg_get_viewdef(view [, pretty])`: the view by oid or by name.
            udf::function("pg_get_viewdef", DataType::Utf8, move |args| {
                let oids = defs.oids(args)?;
                let names = defs.0.read().unwrap_or_else(|e| e.into_inner());
                Ok(ColumnarValue::Array(Arc::new(
                    oids.iter()
                        .map(|o| o.and_then(|o| names.viewdefs.get(&o).cloned()))
                        .collect::<StringArray>(),
                )))
            }),
            // `obj_description(oid [, catalog])`: a relation's comment.
            udf::function("obj_description", DataType::Utf8, move |args| {
                let oids = udf::int_arg(args, 0, "obj_description")?;
                let names = objects.0.read().unwrap_or_else(|e| e.into_inner());
                Ok(ColumnarValue::Array(Arc::new(
                    oids.iter()
                        .map(|o| names.description(o, Some(0)))
                        .collect::<StringArray>(),
                )))
            }),
            // `col_description(table oid, column number)`.
            udf::function("col_description", DataType::Utf8, move |args| {
                let oids = udf::int_arg(args, 0, "col_description")?;
                let nums = udf::int_arg(args, 1, "col_description")?;
                let names = columns.0.read().unwrap_or_else(|e| e.into_inner());
                Ok(ColumnarValue::Array(Arc::new(
                    oids.iter()
                        .zip(nums.iter())
                        .map(|(o, n)| names.description(o, n))
                        .collect::<StringArray>(),
                )))
            }),
            udf::function(REGCLASS_OID, DataType::Int32, move |args| {
                Ok(ColumnarValue::Array(Arc::new(oids.oids(args)?)))
            }),
            udf::function(REGCLASS_NAME, DataType::Utf8, move |args| {
                let oids = names.oids(args)?;
                let names = names.0.read().unwrap_or_else(|e| e.into_inner());
                Ok(ColumnarValue::Array(Arc::new(
                    oids.iter()
                        .map(|o| o.map(|o| names.name_of(o)))
                        .collect::<StringArray>(),
                )))
            }),
        ]
    }

    /// The oids its first argument names.
    fn oids(&self, args: &ScalarFunctionArgs) -> DfResult<Int32Array> {
        let input = udf::arg(args, 0, REGCLASS_OID)?;
        let names = self.0.read().unwrap_or_else(|e| e.into_inner());
        Ok(if input.data_type().is_integer() {
            let v = arrow::compute::cast(&input, &DataType::Int32)?;
            v.as_primitive::<arrow::datatypes::Int32Type>().clone()
        } else if matches!(input.data_type(), DataType::Null) {
            Int32Array::new_null(input.len())
        } else {
            let text = text(&input)?;
            let text = text.as_string::<i32>();
            (0..text.len())
                .map(|i| {
                    if text.is_null(i) {
                        return None;
                    }
                    let v = text.value(i);
                    // A number in text is an oid, as regclass input reads it.
                    v.trim().parse::<i32>().ok().or_else(|| names.oid_of(v))
                })
                .collect()
        })
    }
}

/// Rows of (int, text, int) a catalog query gives (the last column 0 when it has two).
async fn pairs(ctx: &SessionContext, sql: &str) -> DfResult<Vec<(i32, i32, String)>> {
    let batches = ctx.sql(sql).await?.collect().await?;
    let mut out = Vec::new();
    for b in batches {
        let keys = b.column(0).as_primitive::<arrow::datatypes::Int32Type>();
        let values = text(b.column(1))?;
        let values = values.as_string::<i32>();
        let subs = (b.num_columns() > 2)
            .then(|| b.column(2).as_primitive::<arrow::datatypes::Int32Type>());
        for i in 0..b.num_rows() {
            if keys.is_valid(i) && values.is_valid(i) {
                let sub = subs.filter(|s| s.is_valid(i)).map_or(0, |s| s.value(i));
                out.push((keys.value(i), sub, values.value(i).to_string()));
            }
        }
    }
    Ok(out)
}

/// The name the SQL rewrite gives a `CAST(x AS regclass)`.
pub const REGCLASS_OID: &str = "skippr_regclass";
/// The name the SQL rewrite gives a `CAST(CAST(x AS regclass) AS text)`.
pub const REGCLASS_NAME: &str = "skippr_regclass_name";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relation_names() {
        assert_eq!(parse_name("a.b"), Some(vec!["a".into(), "b".into()]));
        assert_eq!(
            parse_name("\"My\"\"Schema\".Tab"),
            Some(vec!["My\"Schema".into(), "tab".into()])
        );
        assert_eq!(parse_name("a..b"), None);
        assert_eq!(parse_name("\"open"), None);

        let mut names = RelationNames {
            search_path: vec!["analytics".into(), "pg_catalog".into()],
            ..Default::default()
        };
        for (oid, schema, rel) in [
            (10, "analytics", "orders"),
            (11, "pg_catalog", "pg_class"),
            (12, "other", "orders"),
        ] {
            names.by_name.insert((schema.into(), rel.into()), oid);
            names.by_oid.insert(oid, (schema.into(), rel.into()));
        }
        assert_eq!(names.oid_of("orders"), Some(10));
        assert_eq!(names.oid_of("pg_class"), Some(11));
        assert_eq!(names.oid_of("other.orders"), Some(12));
        assert_eq!(names.oid_of("\"other\".\"orders\""), Some(12));
        assert_eq!(names.oid_of("missing"), None);
        assert_eq!(names.name_of(10), "orders");
        assert_eq!(names.name_of(12), "other.orders");
        assert_eq!(names.name_of(99), "99");
    }
}
