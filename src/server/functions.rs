//! Gateway, SQL functions: the Postgres built-ins that BI tools and drivers call in their
//! catalog queries (`format`, `json_build_object`, `col_description`, the privilege checks,
//! `regclass` name lookups), evaluated by the query engine while it runs a statement.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Int32Array, StringArray};
use arrow::datatypes::{DataType, Int64Type};
use datafusion::common::ScalarValue;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use datafusion::prelude::SessionContext;

use super::catalog::ident;

/// Registers the functions that need no per-connection state.
pub fn register(ctx: &SessionContext) {
    ctx.register_udf(ScalarUDF::from(Format::default()));
    ctx.register_udf(ScalarUDF::from(JsonBuildObject::default()));
    for name in [
        "col_description",
        "obj_description",
        "shobj_description",
        "pg_get_serial_sequence",
    ] {
        ctx.register_udf(ScalarUDF::from(Constant::new(
            name,
            ScalarValue::Utf8(None),
        )));
    }
    for name in ["pg_collation_is_visible", "pg_type_is_visible"] {
        ctx.register_udf(ScalarUDF::from(Constant::new(
            name,
            ScalarValue::Boolean(Some(true)),
        )));
    }
    for name in [
        "has_table_privilege",
        "has_any_column_privilege",
        "has_column_privilege",
        "has_schema_privilege",
        "has_database_privilege",
    ] {
        ctx.register_udf(ScalarUDF::from(Privilege::new(name)));
    }
}

/// Implements `PartialEq`, `Eq` and `Hash` by function name.
macro_rules! by_name {
    ($t:ty) => {
        impl PartialEq for $t {
            fn eq(&self, other: &Self) -> bool {
                self.name() == other.name()
            }
        }
        impl Eq for $t {}
        impl std::hash::Hash for $t {
            fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
                self.name().hash(state)
            }
        }
    };
}

/// The arguments as arrays of `rows` rows.
fn arrays(args: &ScalarFunctionArgs) -> DfResult<Vec<ArrayRef>> {
    args.args
        .iter()
        .map(|a| a.to_array(args.number_rows))
        .collect()
}

/// An argument as text (NULL stays NULL).
fn text_array(a: &ArrayRef) -> DfResult<ArrayRef> {
    Ok(arrow::compute::cast(a, &DataType::Utf8)?)
}

// ------------------------------------------------------------------------------------------
// format()
// ------------------------------------------------------------------------------------------

/// `format(formatstr, args...)`: `%s` (text, NULL as empty), `%I` (identifier, quoted when
/// needed), `%L` (literal, NULL as `NULL`), `%%`, with optional argument positions (`%2$s`).
#[derive(Debug)]
struct Format {
    signature: Signature,
}

impl Default for Format {
    fn default() -> Self {
        Self {
            signature: Signature::variadic_any(Volatility::Stable),
        }
    }
}

by_name!(Format);

/// Formats one row: `args[i]` is the i-th argument after the format string.
pub(super) fn format_row(fmt: &str, args: &[Option<String>]) -> DfResult<String> {
    let mut out = String::with_capacity(fmt.len());
    let mut chars = fmt.chars().peekable();
    let mut next_arg = 0usize;
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        // An optional position `n$`.
        let mut digits = String::new();
        while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
            digits.push(*d);
            chars.next();
        }
        let position = if digits.is_empty() {
            None
        } else if chars.peek() == Some(&'$') {
            chars.next();
            Some(digits.parse::<usize>().map_err(|_| {
                DataFusionError::Execution(format!("format(): bad argument position {digits}"))
            })?)
        } else {
            return Err(DataFusionError::NotImplemented(
                "format(): field widths are not supported".into(),
            ));
        };
        let Some(kind) = chars.next() else {
            return Err(DataFusionError::Execution(
                "format(): unterminated format specifier".into(),
            ));
        };
        if kind == '%' && position.is_none() {
            out.push('%');
            continue;
        }
        let index = match position {
            Some(0) => {
                return Err(DataFusionError::Execution(
                    "format(): argument positions start at 1".into(),
                ))
            }
            Some(p) => p - 1,
            None => next_arg,
        };
        next_arg = index + 1;
        let Some(value) = args.get(index) else {
            return Err(DataFusionError::Execution(
                "format(): too few arguments".into(),
            ));
        };
        match kind {
            's' => out.push_str(value.as_deref().unwrap_or("")),
            'I' => match value {
                Some(v) => out.push_str(&ident(v)),
                None => {
                    return Err(DataFusionError::Execution(
                        "format(): NULL cannot be formatted as an SQL identifier".into(),
                    ))
                }
            },
            'L' => match value {
                Some(v) => out.push_str(&quote_literal(v)),
                None => out.push_str("NULL"),
            },
            other => {
                return Err(DataFusionError::Execution(format!(
                    "format(): unrecognized format() type specifier \"{other}\""
                )))
            }
        }
    }
    Ok(out)
}

/// A string as a Postgres literal (`E'...'` when it holds backslashes).
fn quote_literal(v: &str) -> String {
    let body = v.replace('\'', "''");
    if v.contains('\\') {
        format!("E'{}'", body.replace('\\', "\\\\"))
    } else {
        format!("'{body}'")
    }
}

impl ScalarUDFImpl for Format {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn name(&self) -> &str {
        "format"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> DfResult<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let rows = args.number_rows;
        let all = arrays(&args)?;
        let Some((fmt, rest)) = all.split_first() else {
            return Err(DataFusionError::Plan(
                "format() needs a format string".into(),
            ));
        };
        let fmt = text_array(fmt)?;
        let fmt = fmt.as_string::<i32>();
        let rest: Vec<ArrayRef> = rest.iter().map(text_array).collect::<DfResult<_>>()?;
        let mut out = Vec::with_capacity(rows);
        let mut values = Vec::with_capacity(rest.len());
        for row in 0..rows {
            if fmt.is_null(row) {
                out.push(None);
                continue;
            }
            values.clear();
            for a in &rest {
                let a = a.as_string::<i32>();
                values.push((!a.is_null(row)).then(|| a.value(row).to_string()));
            }
            out.push(Some(format_row(fmt.value(row), &values)?));
        }
        Ok(ColumnarValue::Array(Arc::new(StringArray::from(out))))
    }
}

// ------------------------------------------------------------------------------------------
// json_build_object()
// ------------------------------------------------------------------------------------------

/// `json_build_object(key, value, ...)`, as JSON text.
#[derive(Debug)]
struct JsonBuildObject {
    signature: Signature,
}

impl Default for JsonBuildObject {
    fn default() -> Self {
        Self {
            signature: Signature::variadic_any(Volatility::Immutable),
        }
    }
}

by_name!(JsonBuildObject);

/// The JSON value of row `row` of `a`.
fn json_value(a: &ArrayRef, row: usize) -> DfResult<serde_json::Value> {
    use serde_json::Value;
    if a.is_null(row) {
        return Ok(Value::Null);
    }
    Ok(match a.data_type() {
        DataType::Boolean => Value::Bool(a.as_boolean().value(row)),
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32 => {
            let v = arrow::compute::cast(&a.slice(row, 1), &DataType::Int64)?;
            Value::from(v.as_primitive::<Int64Type>().value(0))
        }
        DataType::Float32 | DataType::Float64 => {
            let v = arrow::compute::cast(&a.slice(row, 1), &DataType::Float64)?;
            let f = v.as_primitive::<arrow::datatypes::Float64Type>().value(0);
            serde_json::Number::from_f64(f)
                .map(Value::Number)
                .unwrap_or_else(|| Value::String(f.to_string()))
        }
        _ => {
            let v = arrow::compute::cast(&a.slice(row, 1), &DataType::Utf8)?;
            Value::String(v.as_string::<i32>().value(0).to_string())
        }
    })
}

impl ScalarUDFImpl for JsonBuildObject {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn name(&self) -> &str {
        "json_build_object"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> DfResult<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let rows = args.number_rows;
        let all = arrays(&args)?;
        if all.len() % 2 != 0 {
            return Err(DataFusionError::Execution(
                "json_build_object(): argument list must have even number of elements".into(),
            ));
        }
        let mut out = Vec::with_capacity(rows);
        for row in 0..rows {
            let mut object = serde_json::Map::new();
            for pair in all.chunks(2) {
                let key = text_array(&pair[0])?;
                let key = key.as_string::<i32>();
                if key.is_null(row) {
                    return Err(DataFusionError::Execution(
                        "json_build_object(): argument 1 cannot be null".into(),
                    ));
                }
                object.insert(key.value(row).to_string(), json_value(&pair[1], row)?);
            }
            out.push(serde_json::Value::Object(object).to_string());
        }
        Ok(ColumnarValue::Array(Arc::new(StringArray::from(out))))
    }
}

// ------------------------------------------------------------------------------------------
// Functions with a fixed answer in the gateway
// ------------------------------------------------------------------------------------------

/// A function with one answer for every input: NULL text for `col_description` and friends
/// (there are no comments, no sequences), true for the visibility checks (everything the
/// gateway lists is visible).
#[derive(Debug)]
struct Constant {
    name: &'static str,
    value: ScalarValue,
    signature: Signature,
}

impl Constant {
    fn new(name: &'static str, value: ScalarValue) -> Self {
        Self {
            name,
            value,
            signature: Signature::variadic_any(Volatility::Stable),
        }
    }
}

by_name!(Constant);

impl ScalarUDFImpl for Constant {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn name(&self) -> &str {
        self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> DfResult<DataType> {
        Ok(self.value.data_type())
    }

    fn invoke_with_args(&self, _args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        Ok(ColumnarValue::Scalar(self.value.clone()))
    }
}

/// `has_*_privilege([user,] object, [column,] privilege)`: the gateway is read-only, so
/// reading privileges (`SELECT`, `USAGE`, `CONNECT`, ...) are granted and writing ones
/// (`INSERT`, `UPDATE`, `DELETE`, `TRUNCATE`, `CREATE`, ...) are not. The privilege is the
/// last argument; it may list several (`'SELECT, INSERT'`): any granted one grants.
#[derive(Debug)]
struct Privilege {
    name: &'static str,
    signature: Signature,
}

impl Privilege {
    fn new(name: &'static str) -> Self {
        Self {
            name,
            signature: Signature::variadic_any(Volatility::Stable),
        }
    }
}

by_name!(Privilege);

/// Whether a read-only gateway grants `privileges` (a comma-separated list).
pub(super) fn read_only_grants(privileges: &str) -> bool {
    privileges.split(',').any(|p| {
        let p = p.trim().to_ascii_lowercase();
        let p = p.trim_end_matches(" with grant option");
        matches!(p, "select" | "usage" | "connect" | "temporary" | "temp")
    })
}

impl ScalarUDFImpl for Privilege {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn name(&self) -> &str {
        self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> DfResult<DataType> {
        Ok(DataType::Boolean)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let Some(last) = args.args.last() else {
            return Err(DataFusionError::Plan(format!(
                "{}() needs a privilege argument",
                self.name
            )));
        };
        let privileges = text_array(&last.to_array(args.number_rows)?)?;
        let privileges = privileges.as_string::<i32>();
        let out: BooleanArray = (0..args.number_rows)
            .map(|i| (!privileges.is_null(i)).then(|| read_only_grants(privileges.value(i))))
            .collect();
        Ok(ColumnarValue::Array(Arc::new(out)))
    }
}

// ------------------------------------------------------------------------------------------
// regclass
// ------------------------------------------------------------------------------------------

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
}

impl RelationNames {
    /// The oid of a relation named as `regclass` input reads it: `name`, `schema.name`, each
    /// part bare (case-folded) or double-quoted.
    pub(super) fn oid_of(&self, name: &str) -> Option<i32> {
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

    /// How `regclass` output prints a relation: its name, schema-qualified when the schema
    /// is not searched; the number itself for an unknown oid.
    pub(super) fn name_of(&self, oid: i32) -> String {
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
pub(super) fn parse_name(name: &str) -> Option<Vec<String>> {
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
    pub async fn refresh(&self, ctx: &SessionContext, search_path: Vec<String>) -> DfResult<()> {
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
            let schemas = text_array(b.column(1))?;
            let schemas = schemas.as_string::<i32>();
            let rels = text_array(b.column(2))?;
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
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = names;
        Ok(())
    }

    /// The per-connection functions reading this snapshot.
    pub fn udfs(&self) -> [ScalarUDF; 2] {
        [
            ScalarUDF::from(Regclass {
                relations: self.clone(),
                signature: Signature::variadic_any(Volatility::Stable),
                output: RegclassOutput::Oid,
            }),
            ScalarUDF::from(Regclass {
                relations: self.clone(),
                signature: Signature::variadic_any(Volatility::Stable),
                output: RegclassOutput::Name,
            }),
        ]
    }
}

/// The name the SQL rewrite gives a `CAST(x AS regclass)`.
pub const REGCLASS_OID: &str = "skippr_regclass";
/// The name the SQL rewrite gives a `CAST(CAST(x AS regclass) AS text)`.
pub const REGCLASS_NAME: &str = "skippr_regclass_name";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum RegclassOutput {
    Oid,
    Name,
}

/// `x::regclass` (the relation's oid) and `x::regclass::text` (its name). `x` is a relation
/// name (text) or already an oid (a number). An unknown name gives NULL, like
/// `to_regclass()`.
#[derive(Debug)]
struct Regclass {
    relations: Relations,
    signature: Signature,
    output: RegclassOutput,
}

impl PartialEq for Regclass {
    fn eq(&self, other: &Self) -> bool {
        self.output == other.output && Arc::ptr_eq(&self.relations.0, &other.relations.0)
    }
}

impl Eq for Regclass {}

impl std::hash::Hash for Regclass {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.output.hash(state)
    }
}

impl ScalarUDFImpl for Regclass {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn name(&self) -> &str {
        match self.output {
            RegclassOutput::Oid => REGCLASS_OID,
            RegclassOutput::Name => REGCLASS_NAME,
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> DfResult<DataType> {
        Ok(match self.output {
            RegclassOutput::Oid => DataType::Int32,
            RegclassOutput::Name => DataType::Utf8,
        })
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let Some(first) = args.args.first() else {
            return Err(DataFusionError::Plan(format!(
                "{}() needs an argument",
                self.name()
            )));
        };
        let input = first.to_array(args.number_rows)?;
        let names = self.relations.0.read().unwrap_or_else(|e| e.into_inner());
        let oids: Int32Array = if input.data_type().is_integer() {
            let v = arrow::compute::cast(&input, &DataType::Int32)?;
            v.as_primitive::<arrow::datatypes::Int32Type>().clone()
        } else if matches!(input.data_type(), DataType::Null) {
            Int32Array::new_null(input.len())
        } else {
            let text = text_array(&input)?;
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
        };
        Ok(ColumnarValue::Array(match self.output {
            RegclassOutput::Oid => Arc::new(oids),
            RegclassOutput::Name => Arc::new(
                oids.iter()
                    .map(|o| o.map(|o| names.name_of(o)))
                    .collect::<StringArray>(),
            ),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(values: &[Option<&str>]) -> Vec<Option<String>> {
        values.iter().map(|v| v.map(str::to_string)).collect()
    }

    #[test]
    fn format_specifiers() {
        assert_eq!(
            format_row("%s", &args(&[Some("int4")])).ok(),
            Some("int4".into())
        );
        assert_eq!(
            format_row("\"%s\".\"%s\"", &args(&[Some("a"), Some("b")])).ok(),
            Some("\"a\".\"b\"".into())
        );
        assert_eq!(
            format_row("%I.%I", &args(&[Some("analytics"), Some("Mixed Case")])).ok(),
            Some("analytics.\"Mixed Case\"".into())
        );
        assert_eq!(
            format_row("%L and %L, 100%%", &args(&[Some("it's"), None])).ok(),
            Some("'it''s' and NULL, 100%".into())
        );
        assert_eq!(
            format_row("%2$s %1$s %s", &args(&[Some("a"), Some("b")])).ok(),
            Some("b a b".into())
        );
        assert_eq!(format_row("%s|", &args(&[None])).ok(), Some("|".into()));
        assert!(format_row("%s %s", &args(&[Some("a")])).is_err());
        assert!(format_row("%I", &args(&[None])).is_err());
        assert!(format_row("%x", &args(&[Some("a")])).is_err());
    }

    #[test]
    fn privileges_of_a_read_only_gateway() {
        assert!(read_only_grants("select"));
        assert!(read_only_grants("USAGE"));
        assert!(read_only_grants("INSERT, SELECT"));
        assert!(!read_only_grants("update"));
        assert!(!read_only_grants("delete"));
        assert!(!read_only_grants("INSERT WITH GRANT OPTION"));
    }

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
