//! Unit tests of the Glue catalog against an in-process Glue that checks `VersionId`
//! (the local stand-in used end to end does not), with Iceberg files in memory.

use std::sync::Arc;

use iceberg::spec::{NestedField, PrimitiveType, Schema, Type};
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use iceberg::{Catalog, NamespaceIdent, TableCreation};

use super::super::glue_api::fake::FakeGlue;
use super::super::glue_api::GlueApi;
use super::*;

fn catalog() -> (Arc<FakeGlue>, GlueCatalog) {
    let fake = Arc::new(FakeGlue::default());
    let api: Arc<dyn GlueApi> = fake.clone();
    let catalog = GlueCatalog::new(
        api,
        "analytics",
        "s3://wh-bucket/lake/",
        FileIO::new_with_memory(),
    );
    (fake, catalog)
}

async fn create(catalog: &GlueCatalog) -> iceberg::Result<Table> {
    let ns = NamespaceIdent::new("analytics".into());
    catalog.create_namespace(&ns, HashMap::new()).await?;
    // A second call finds the database there: no error.
    catalog.create_namespace(&ns, HashMap::new()).await?;
    let schema = Schema::builder()
        .with_fields(vec![
            NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
            NestedField::optional(2, "note", Type::Primitive(PrimitiveType::String)).into(),
        ])
        .build()?;
    catalog
        .create_table(
            &ns,
            TableCreation::builder()
                .name("orders".into())
                .schema(schema)
                .build(),
        )
        .await
}

fn glue_table(fake: &FakeGlue) -> Value {
    let tables = fake.tables.lock().unwrap_or_else(|e| e.into_inner());
    tables
        .get(&("analytics".to_string(), "orders".to_string()))
        .map(|(t, _)| t.clone())
        .unwrap_or(Value::Null)
}

#[tokio::test]
async fn tables_are_registered_as_athena_expects() -> iceberg::Result<()> {
    let (fake, catalog) = catalog();
    let table = create(&catalog).await?;
    let t = glue_table(&fake);
    assert_eq!(t["TableType"], "EXTERNAL_TABLE");
    assert_eq!(t["Parameters"]["table_type"], "ICEBERG");
    assert_eq!(
        t["Parameters"]["metadata_location"].as_str(),
        table.metadata_location()
    );
    assert!(t["Parameters"].get("previous_metadata_location").is_none());
    assert_eq!(
        t["StorageDescriptor"]["Location"],
        "s3://wh-bucket/lake/analytics.db/orders"
    );
    let cols = &t["StorageDescriptor"]["Columns"];
    assert_eq!(cols[0]["Name"], "id");
    assert_eq!(cols[0]["Type"], "bigint");
    assert_eq!(cols[1]["Type"], "string");
    assert_eq!(cols[1]["Parameters"]["iceberg.field.optional"], "true");

    let loaded = catalog.load_table(table.identifier()).await?;
    assert_eq!(loaded.metadata_location(), table.metadata_location());
    assert_eq!(
        catalog.list_tables(table.identifier().namespace()).await?,
        vec![table.identifier().clone()]
    );
    Ok(())
}

#[tokio::test]
async fn a_commit_swaps_the_pointer_and_keeps_the_previous_one() -> iceberg::Result<()> {
    let (fake, catalog) = catalog();
    let table = create(&catalog).await?;
    let first = table.metadata_location().map(str::to_string);
    // iceberg's own transaction path (schema-free property change) goes through update_table.
    let tx = Transaction::new(&table);
    let tx = tx
        .update_table_properties()
        .set("skippr.test".into(), "1".into())
        .apply(tx)?;
    let after = tx.commit(&catalog).await?;
    let t = glue_table(&fake);
    assert_eq!(
        t["Parameters"]["metadata_location"].as_str(),
        after.metadata_location()
    );
    assert_eq!(
        t["Parameters"]["previous_metadata_location"].as_str(),
        first.as_deref()
    );
    assert_ne!(after.metadata_location(), first.as_deref());
    assert_eq!(
        after
            .metadata()
            .properties()
            .get("skippr.test")
            .map(String::as_str),
        Some("1")
    );
    Ok(())
}

#[tokio::test]
async fn a_concurrent_writer_is_detected_never_overwritten() -> iceberg::Result<()> {
    let (_fake, catalog) = catalog();
    let table = create(&catalog).await?;
    let ident = table.identifier().clone();
    let old = table.metadata_location_result()?.to_string();
    // Two next metadata files, as two writers would stage them from the same table.
    let current = MetadataLocation::from_str(&old)?;
    let (a, b) = (current.with_next_version(), current.with_next_version());
    for path in [&a, &b] {
        table.metadata().write_to(&catalog.file_io, path).await?;
    }
    let (a, b) = (a.to_string(), b.to_string());

    // Writer B wins; A still believes the table is at `old`.
    catalog.swap(&ident, &old, &b).await?;
    let err = catalog.swap(&ident, &old, &a).await.err();
    assert_eq!(
        err.map(|e| e.kind()),
        Some(iceberg::ErrorKind::CatalogCommitConflicts)
    );
    assert_eq!(catalog.metadata_location(&ident).await?, Some(b.clone()));

    assert_eq!(catalog.metadata_location(&ident).await?, Some(b));
    Ok(())
}

#[tokio::test]
async fn a_swap_between_read_and_update_is_refused_by_version() -> iceberg::Result<()> {
    /// Lets one other writer commit right after the catalog's GetTable, inside its swap.
    #[derive(Debug)]
    struct Racing {
        inner: Arc<FakeGlue>,
        raced: std::sync::Mutex<Option<String>>,
    }
    #[async_trait]
    impl GlueApi for Racing {
        async fn call(&self, operation: &str, input: Value) -> Result<Value, GlueError> {
            let out = self.inner.call(operation, input).await;
            let pending = self.raced.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let (Some(other), "GetTable", Ok(t)) = (pending, operation, &out) {
                let mut update = t["Table"].clone();
                update["Parameters"]["metadata_location"] = json!(other);
                let version = update["VersionId"].clone();
                self.inner
                    .call(
                        "UpdateTable",
                        json!({ "DatabaseName": "analytics", "VersionId": version, "TableInput": update }),
                    )
                    .await?;
            }
            out
        }
    }
    let fake = Arc::new(FakeGlue::default());
    let racing = Arc::new(Racing {
        inner: fake.clone(),
        raced: std::sync::Mutex::new(None),
    });
    let api: Arc<dyn GlueApi> = racing.clone();
    let catalog = GlueCatalog::new(
        api,
        "analytics",
        "s3://wh-bucket/lake",
        FileIO::new_with_memory(),
    );
    let table = create(&catalog).await?;
    let ident = table.identifier().clone();
    let old = table.metadata_location_result()?.to_string();
    let current = MetadataLocation::from_str(&old)?;
    let (mine, theirs) = (current.with_next_version(), current.with_next_version());
    table.metadata().write_to(&catalog.file_io, &mine).await?;
    let (mine, theirs) = (mine.to_string(), theirs.to_string());
    *racing.raced.lock().unwrap_or_else(|e| e.into_inner()) = Some(theirs.clone());

    let err = catalog.swap(&ident, &old, &mine).await.err();
    assert_eq!(
        err.map(|e| e.kind()),
        Some(iceberg::ErrorKind::CatalogCommitConflicts)
    );
    assert_eq!(catalog.metadata_location(&ident).await?, Some(theirs));
    Ok(())
}

#[tokio::test]
async fn a_glue_table_that_is_not_iceberg_is_named() -> iceberg::Result<()> {
    let (fake, catalog) = catalog();
    let table = create(&catalog).await?;
    fake.tables
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(
            ("analytics".into(), "orders".into()),
            (
                json!({ "Name": "orders", "Parameters": { "classification": "csv" } }),
                9,
            ),
        );
    let err = catalog.load_table(table.identifier()).await.err();
    assert!(err.is_some_and(|e| e.to_string().contains("is not an Iceberg table")));
    Ok(())
}
