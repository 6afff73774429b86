//! Gateway, Postgres imitation, catalog types: every `pg_catalog` and `information_schema`
//! column the gateway serves has the type Postgres gives it. Vectors and arrays
//! (`pg_index.indkey` is an `int2vector`, `pg_constraint.conkey` an `int2[]`) are Arrow lists,
//! so `attnum = ANY(indkey)`, subscripts, `unnest` and `array_length` plan as on Postgres; every
//! column carries its Postgres type name in its field metadata ([`PG_TYPE_META`]), which the
//! wire (the type a client is told), casts to text and `pg_typeof` read.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use arrow::array::{Array, ArrayRef, AsArray, ListBuilder};
use arrow::array::{RecordBatch, StringBuilder};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::Result as DfResult;
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;

use crate::query::live::PG_TYPE_META;

/// Postgres's own type of each catalog column: (schema, relation, column) -> type name as
/// `format_type` spells it, domains as their base type (Postgres describes them so).
static CATALOG_TYPES: LazyLock<HashMap<(&'static str, &'static str, &'static str), &'static str>> =
    LazyLock::new(|| {
        include_str!("catalog_types.tsv")
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .filter_map(|l| {
                let mut parts = l.split('\t');
                Some(((parts.next()?, parts.next()?, parts.next()?), parts.next()?))
            })
            .collect()
    });

/// The Postgres type of a catalog column, when Postgres has that column.
pub fn catalog_type(schema: &str, relation: &str, column: &str) -> Option<&'static str> {
    CATALOG_TYPES.get(&(schema, relation, column)).copied()
}

/// Whether a Postgres type is a vector (`int2vector`, `oidvector`): an array whose subscripts
/// start at 0 and whose text form is its values separated by spaces.
pub fn is_vector(pg_type: &str) -> bool {
    matches!(pg_type, "int2vector" | "oidvector")
}

/// The Postgres type a field carries in its metadata, if any.
pub fn field_pg_type(field: &Field) -> Option<&str> {
    field.metadata().get(PG_TYPE_META).map(String::as_str)
}

/// The Arrow type that holds a catalog column of Postgres type `pg_type`, stored as `stored`.
pub fn carrier(pg_type: &str, stored: &DataType) -> DataType {
    let list = |item: DataType| DataType::List(Arc::new(Field::new("item", item, true)));
    let integer = stored.is_integer();
    match pg_type {
        "int2vector" | "smallint[]" => list(DataType::Int16),
        "oidvector" | "oid[]" | "regtype[]" => list(DataType::Int32),
        "text[]" | "name[]" | "aclitem[]" | "\"char\"[]" => list(DataType::Utf8),
        "smallint" if integer => DataType::Int16,
        "integer" | "oid" | "xid" if integer => DataType::Int32,
        "bigint" if integer => DataType::Int64,
        _ => stored.clone(),
    }
}

/// A catalog table whose columns have Postgres's types (see the module doc). Wraps the
/// table that produces the rows; only the columns Postgres has are typed.
pub struct Typed {
    base: Arc<dyn TableProvider>,
    schema: SchemaRef,
}

impl std::fmt::Debug for Typed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Typed({:?})", self.schema)
    }
}

impl Typed {
    /// `base`, the catalog relation `schema.relation`, with Postgres's column types; `base`
    /// itself when Postgres has no such relation.
    pub fn wrap(
        schema: &str,
        relation: &str,
        base: Arc<dyn TableProvider>,
    ) -> Arc<dyn TableProvider> {
        let relation = relation.to_ascii_lowercase();
        let stored = base.schema();
        let mut typed_any = false;
        let fields: Vec<Field> = stored
            .fields()
            .iter()
            .map(|f| match catalog_type(schema, &relation, f.name()) {
                Some(pg) => {
                    typed_any = true;
                    let mut meta = f.metadata().clone();
                    meta.insert(PG_TYPE_META.to_string(), pg.to_string());
                    f.as_ref()
                        .clone()
                        .with_data_type(carrier(pg, f.data_type()))
                        .with_metadata(meta)
                }
                None => f.as_ref().clone(),
            })
            .collect();
        if !typed_any {
            return base;
        }
        Arc::new(Typed {
            base,
            schema: Arc::new(Schema::new_with_metadata(fields, stored.metadata().clone())),
        })
    }
}

#[async_trait]
impl TableProvider for Typed {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        self.base.table_type()
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let plan = self.base.scan(state, None, &[], None).await?;
        let batches = datafusion::physical_plan::collect(plan, state.task_ctx()).await?;
        let batches = batches
            .into_iter()
            .map(|b| typed_batch(&b, &self.schema))
            .collect::<DfResult<Vec<_>>>()?;
        Ok(MemorySourceConfig::try_new_exec(
            &[batches],
            self.schema.clone(),
            projection.cloned(),
        )?)
    }
}

/// `batch` with each column converted to the type `schema` gives it.
pub fn typed_batch(batch: &RecordBatch, schema: &SchemaRef) -> DfResult<RecordBatch> {
    let columns = batch
        .columns()
        .iter()
        .zip(schema.fields())
        .map(|(c, f)| convert(c, f.data_type()))
        .collect::<DfResult<Vec<_>>>()?;
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

/// A column as type `to`: text holding a vector (`1 2`) or an array (`{1,2}`, `[1, 2]`)
/// becomes a list, anything else is cast.
fn convert(column: &ArrayRef, to: &DataType) -> DfResult<ArrayRef> {
    if column.data_type() == to {
        return Ok(column.clone());
    }
    match (column.data_type(), to) {
        (DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View, DataType::List(item)) => {
            let text = arrow::compute::cast(column, &DataType::Utf8)?;
            parse_lists(text.as_string::<i32>(), item.data_type())
        }
        _ => Ok(arrow::compute::cast(column, to)?),
    }
}

/// The elements of an array's or a vector's text form: `{a,b}`, `[a, b]` or `a b`. Double
/// quotes group an element (`{"a b",c}`) and a backslash escapes the next character; an
/// unquoted `NULL` in braces is a null element.
pub fn split_elements(text: &str) -> Vec<Option<String>> {
    let t = text.trim();
    let inner = t
        .strip_prefix('{')
        .map(|r| r.strip_suffix('}').unwrap_or(r))
        .or_else(|| {
            t.strip_prefix('[')
                .map(|r| r.strip_suffix(']').unwrap_or(r))
        });
    let braced = inner.is_some();
    let inner = inner.unwrap_or(t);
    let mut out = Vec::new();
    let mut current = String::new();
    let mut quoted = false;
    let mut was_quoted = false;
    let mut chars = inner.chars();
    let push = |current: &mut String, was_quoted: &mut bool, out: &mut Vec<Option<String>>| {
        let value = std::mem::take(current);
        let value = if *was_quoted {
            value
        } else {
            value.trim().to_string()
        };
        if !value.is_empty() || *was_quoted {
            let null = braced && !*was_quoted && value.eq_ignore_ascii_case("null");
            out.push((!null).then_some(value));
        }
        *was_quoted = false;
    };
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                quoted = !quoted;
                was_quoted = true;
            }
            '\\' => {
                if let Some(n) = chars.next() {
                    current.push(n);
                }
            }
            ',' if braced && !quoted => push(&mut current, &mut was_quoted, &mut out),
            c if c.is_whitespace() && !braced && !quoted => {
                push(&mut current, &mut was_quoted, &mut out)
            }
            c => current.push(c),
        }
    }
    push(&mut current, &mut was_quoted, &mut out);
    out
}

/// Text forms of arrays or vectors as a list of `item`s (NULL text stays a NULL list); an
/// element that is not an `item` is an error naming it.
pub fn parse_lists(text: &arrow::array::StringArray, item: &DataType) -> DfResult<ArrayRef> {
    let mut b = ListBuilder::new(StringBuilder::new());
    for v in text.iter() {
        match v {
            Some(v) => {
                for e in split_elements(v) {
                    b.values().append_option(e);
                }
                b.append(true);
            }
            None => b.append(false),
        }
    }
    let texts: ArrayRef = Arc::new(b.finish());
    if item == &DataType::Utf8 {
        return Ok(texts);
    }
    let to = DataType::List(Arc::new(Field::new("item", item.clone(), true)));
    let strict = arrow::compute::CastOptions {
        safe: false,
        ..Default::default()
    };
    arrow::compute::cast_with_options(&texts, &to, &strict).map_err(|e| {
        datafusion::error::DataFusionError::Execution(format!(
            "invalid input syntax for an array of {item}: {e}"
        ))
    })
}

/// The Postgres text form of a list: `{1,2}` for an array, `1 2` for a vector. Elements that
/// need it are double-quoted with `"` and `\` escaped, NULL elements are `NULL`.
pub fn list_text(list: &ArrayRef, vector: bool) -> DfResult<ArrayRef> {
    let DataType::List(_) = list.data_type() else {
        return Ok(arrow::compute::cast(list, &DataType::Utf8)?);
    };
    let lists = list.as_list::<i32>();
    let mut out = StringBuilder::new();
    for i in 0..lists.len() {
        if lists.is_null(i) {
            out.append_null();
            continue;
        }
        let values = lists.value(i);
        let texts = element_texts(&values)?;
        let texts = texts.as_string::<i32>();
        let mut parts = Vec::with_capacity(texts.len());
        for j in 0..texts.len() {
            parts.push(if texts.is_null(j) {
                "NULL".to_string()
            } else if vector {
                texts.value(j).to_string()
            } else {
                quote_element(texts.value(j))
            });
        }
        if vector {
            out.append_value(parts.join(" "));
        } else {
            out.append_value(format!("{{{}}}", parts.join(",")));
        }
    }
    Ok(Arc::new(out.finish()))
}

/// The elements of a list as text, nested lists in their own array form.
fn element_texts(values: &ArrayRef) -> DfResult<ArrayRef> {
    match values.data_type() {
        DataType::List(_) => list_text(values, false),
        DataType::Boolean => {
            let b = values.as_boolean();
            let out: arrow::array::StringArray = b
                .iter()
                .map(|v| v.map(|v| if v { "t" } else { "f" }))
                .collect();
            Ok(Arc::new(out))
        }
        _ => Ok(arrow::compute::cast(values, &DataType::Utf8)?),
    }
}

/// An array element as Postgres prints it: quoted when empty, `NULL`, or holding a
/// delimiter, brace, quote, backslash or white space.
fn quote_element(v: &str) -> String {
    let needs = v.is_empty()
        || v.eq_ignore_ascii_case("null")
        || v.chars()
            .any(|c| matches!(c, ',' | '{' | '}' | '"' | '\\') || c.is_whitespace());
    if !needs {
        return v.to_string();
    }
    let mut s = String::with_capacity(v.len() + 2);
    s.push('"');
    for c in v.chars() {
        if c == '"' || c == '\\' {
            s.push('\\');
        }
        s.push(c);
    }
    s.push('"');
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::StringArray;

    #[test]
    fn catalog_columns_have_postgres_types() {
        assert_eq!(
            catalog_type("pg_catalog", "pg_index", "indkey"),
            Some("int2vector")
        );
        assert_eq!(
            catalog_type("pg_catalog", "pg_constraint", "conkey"),
            Some("smallint[]")
        );
        assert_eq!(
            catalog_type("pg_catalog", "pg_class", "relkind"),
            Some("\"char\"")
        );
        assert_eq!(
            catalog_type("pg_catalog", "pg_class", "relname"),
            Some("name")
        );
        assert_eq!(
            catalog_type("information_schema", "columns", "ordinal_position"),
            Some("integer")
        );
        assert_eq!(catalog_type("pg_catalog", "pg_class", "nosuch"), None);
    }

    #[test]
    fn text_forms_parse_into_lists_and_print_back() -> DfResult<()> {
        let text = StringArray::from(vec![
            Some("1 2"),
            Some("[3, 4]"),
            Some("{5,NULL}"),
            None,
            Some(""),
        ]);
        let lists = parse_lists(&text, &DataType::Int16)?;
        assert_eq!(lists.len(), 5);
        let printed = list_text(&lists, false)?;
        let printed = printed.as_string::<i32>();
        assert_eq!(printed.value(0), "{1,2}");
        assert_eq!(printed.value(1), "{3,4}");
        assert_eq!(printed.value(2), "{5,NULL}");
        assert!(printed.is_null(3));
        assert_eq!(printed.value(4), "{}");
        let vector = list_text(&lists, true)?;
        assert_eq!(vector.as_string::<i32>().value(0), "1 2");
        // An unclosed brace before a multi-byte character is read, not cut inside it.
        let open = parse_lists(&StringArray::from(vec!["{é"]), &DataType::Utf8)?;
        assert_eq!(list_text(&open, false)?.as_string::<i32>().value(0), "{é}");
        let words = parse_lists(
            &StringArray::from(vec![r#"{"a b",c,"",d\"e}"#]),
            &DataType::Utf8,
        )?;
        let back = list_text(&words, false)?;
        assert_eq!(back.as_string::<i32>().value(0), r#"{"a b",c,"","d\"e"}"#);
        assert!(parse_lists(&StringArray::from(vec!["{x}"]), &DataType::Int16).is_err());
        Ok(())
    }
}
