//! Helpers for the unit tests of every layer (no part of the data flow itself): assertions
//! on the messages the layers write for users.

/// Asserts that `text` holds each of `words`, showing `text` when one is missing.
#[track_caller]
pub fn assert_contains(text: &str, words: &[&str]) {
    for word in words {
        assert!(text.contains(word), "`{word}` is not in: {text}");
    }
}

/// A table `public.items (id bigint, note text)` and its Iceberg table, made in a fresh
/// local catalog under `dir`.
pub async fn items_table(
    dir: &std::path::Path,
) -> crate::error::Result<(
    crate::catalog::LocalCatalog,
    crate::source::postgres::schema::TableSchema,
    iceberg::table::Table,
)> {
    use crate::change::{schema::Column, types::PgType};
    let catalog = crate::catalog::LocalCatalog::open(dir).await?;
    let namespace = catalog.ensure_namespace("app").await?;
    let schema = crate::source::postgres::schema::TableSchema::for_test(
        "public.items",
        vec![
            Column::for_test("id", PgType::Int8, "bigint"),
            Column::for_test("note", PgType::Text, "text"),
        ],
    );
    let table = crate::table::schema::create_or_load(
        &catalog,
        &namespace,
        &schema,
        &crate::config::layout::Layout::default(),
    )
    .await?;
    Ok((catalog, schema, table))
}
