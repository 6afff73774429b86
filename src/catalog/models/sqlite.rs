//! Catalogs, models in the sqlite catalog: model schemas are namespaces marked
//! `skippr.models`, model tables are ordinary rows of `iceberg_tables` (PyIceberg and DuckDB
//! read them like any other), views and comments live in two tables of Skippr's own beside
//! them. A commit runs in one `BEGIN IMMEDIATE` transaction: read, apply the ops, write the
//! difference.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use iceberg::io::FileIO;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqliteRow};
use sqlx::{ConnectOptions, Row};

use super::{ModelsState, Op, Refused, RelName, ViewDef};
use crate::catalog::CATALOG_NAME;
use crate::error::{Context, Error, Result};

/// Namespace property marking a models schema.
const MODELS_PROPERTY: &str = "skippr.models";
/// Every statement waits this long for another writer of the catalog.
const BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS skippr_views (
        catalog_name VARCHAR(255) NOT NULL,
        namespace VARCHAR(255) NOT NULL,
        name VARCHAR(255) NOT NULL,
        definition TEXT NOT NULL,
        PRIMARY KEY (catalog_name, namespace, name))",
    "CREATE TABLE IF NOT EXISTS skippr_comments (
        catalog_name VARCHAR(255) NOT NULL,
        namespace VARCHAR(255) NOT NULL,
        relation VARCHAR(255) NOT NULL,
        column_name VARCHAR(255) NOT NULL,
        comment TEXT NOT NULL,
        PRIMARY KEY (catalog_name, namespace, relation, column_name))",
];

/// What a commit did.
#[derive(Debug)]
pub struct Committed {
    /// The models after it.
    pub state: Arc<ModelsState>,
    /// Folders of tables it dropped, whose files may go once no reader needs them.
    pub dropped: Vec<String>,
}

/// The models of one warehouse's sqlite catalog.
pub struct ModelsCatalog {
    db: PathBuf,
    /// `file://<warehouse>`: new tables get a folder below it.
    pub(super) warehouse: String,
    file_io: FileIO,
    /// Namespaces that are never models (the workspace of replicated tables, `skippr`).
    protected: Vec<String>,
    /// A read connection and what it last found.
    reader: tokio::sync::Mutex<Option<(SqliteConnection, Checked)>>,
}

/// The reader's last look at the catalog.
struct Checked {
    /// The catalog's `data_version` then.
    version: i64,
    /// When the look began: a caller that asked before it may share its answer.
    at: Instant,
    state: Arc<ModelsState>,
}

impl std::fmt::Debug for ModelsCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ModelsCatalog({})", self.db.display())
    }
}

impl ModelsCatalog {
    /// The models of the catalog `db` of the warehouse folder `warehouse` (both already
    /// resolved); `protected` namespaces are never models.
    pub fn new(db: PathBuf, warehouse: &Path, protected: Vec<String>) -> Self {
        Self {
            db,
            warehouse: format!("file://{}", warehouse.display()),
            file_io: FileIO::new_with_fs(),
            protected,
            reader: tokio::sync::Mutex::new(None),
        }
    }

    /// The file I/O of the warehouse.
    pub fn file_io(&self) -> &FileIO {
        &self.file_io
    }

    /// Whether `namespace` can never hold models.
    pub fn is_protected(&self, namespace: &str) -> bool {
        self.protected.iter().any(|p| p == namespace)
    }

    /// A new, unique folder for a table named `rel`.
    pub fn new_location(&self, rel: &RelName) -> String {
        format!(
            "{}/{}/{}-{}",
            self.warehouse,
            rel.0,
            rel.1,
            uuid::Uuid::now_v7().simple()
        )
    }

    /// Whether `folder` is a table folder this catalog created (so that its files may be
    /// deleted after a drop).
    pub fn owns_folder(&self, folder: &str) -> bool {
        folder
            .strip_prefix(&self.warehouse)
            .and_then(|rest| rest.strip_prefix('/'))
            .is_some_and(|rest| {
                let parts: Vec<&str> = rest.split('/').collect();
                parts.len() == 2
                    && !self.is_protected(parts[0])
                    && !parts.iter().any(|p| p.is_empty() || *p == "..")
            })
    }

    /// Whether `path` is a file of a table folder this catalog created
    /// (`<folder>/data/<file>` or `<folder>/metadata/<file>`).
    pub fn owns_file(&self, path: &str) -> bool {
        let Some((dir, file)) = path.rsplit_once('/') else {
            return false;
        };
        let folder = dir
            .strip_suffix("/data")
            .or_else(|| dir.strip_suffix("/metadata"));
        !file.is_empty() && file != ".." && folder.is_some_and(|f| self.owns_folder(f))
    }

    async fn connect(&self) -> Result<SqliteConnection> {
        let mut conn = SqliteConnectOptions::new()
            .filename(&self.db)
            .busy_timeout(BUSY_TIMEOUT)
            .connect()
            .await
            .with_context(|| format!("opening the catalog {}", self.db.display()))?;
        for ddl in SCHEMA {
            sqlx::query(ddl)
                .execute(&mut conn)
                .await
                .with_context(|| format!("preparing the catalog {}", self.db.display()))?;
        }
        Ok(conn)
    }

    /// The models as committed now. Read again only when the catalog changed since the
    /// last read (sqlite's `data_version`).
    pub async fn state(&self) -> Result<Arc<ModelsState>> {
        // Statements that arrive together share one look: a look that began after this
        // call sees every commit made before it.
        let asked = Instant::now();
        let mut reader = self.reader.lock().await;
        if reader.is_none() {
            let conn = self.connect().await?;
            let first = Checked {
                version: -1,
                at: asked,
                state: Arc::default(),
            };
            *reader = Some((conn, first));
        }
        let Some((conn, checked)) = reader.as_mut() else {
            return Err(Error::fatal("the catalog reader was not opened"));
        };
        if checked.version >= 0 && checked.at > asked {
            return Ok(checked.state.clone());
        }
        let at = Instant::now();
        let now: i64 = sqlx::query_scalar("PRAGMA data_version")
            .fetch_one(&mut *conn)
            .await
            .with_context(|| format!("reading the catalog {}", self.db.display()))?;
        if now != checked.version {
            sqlx::query("BEGIN")
                .execute(&mut *conn)
                .await
                .context("reading the models")?;
            let read = self.read(conn).await;
            let _ = sqlx::query("COMMIT").execute(&mut *conn).await;
            checked.state = Arc::new(read?);
            checked.version = now;
        }
        checked.at = at;
        Ok(checked.state.clone())
    }

    /// Applies `ops` to the committed models in one transaction. `Ok(Err(_))` when an op
    /// does not apply to the models as they are now (nothing is written then).
    pub async fn commit(&self, ops: &[Op]) -> Result<std::result::Result<Committed, Refused>> {
        for op in ops {
            if let Some(ns) = namespace_of(op).filter(|ns| self.is_protected(ns)) {
                return Err(Error::fatal(format!(
                    "a change of the models names schema {ns}, which holds replicated tables"
                )));
            }
        }
        let mut conn = self.connect().await?;
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut conn)
            .await
            .with_context(|| format!("locking the catalog {}", self.db.display()))?;
        let done = self.commit_in(&mut conn, ops).await;
        let end = match &done {
            Ok(Ok(_)) => "COMMIT",
            _ => "ROLLBACK",
        };
        let ended = sqlx::query(end).execute(&mut conn).await;
        let done = done?;
        ended.with_context(|| format!("committing to the catalog {}", self.db.display()))?;
        Ok(done)
    }

    async fn commit_in(
        &self,
        conn: &mut SqliteConnection,
        ops: &[Op],
    ) -> Result<std::result::Result<Committed, Refused>> {
        let old = self.read(conn).await?;
        let new = match old.after(ops) {
            Ok(new) => new,
            Err(refused) => return Ok(Err(refused)),
        };
        for ns in new.namespaces.difference(&old.namespaces) {
            let taken: Option<i64> = sqlx::query_scalar(
                "SELECT 1 FROM iceberg_namespace_properties WHERE catalog_name = ? AND namespace = ? LIMIT 1",
            )
            .bind(CATALOG_NAME)
            .bind(ns)
            .fetch_optional(&mut *conn)
            .await
            .context("reading the catalog's namespaces")?;
            if taken.is_some() {
                return Ok(Err(super::refused(
                    super::Conflict::Exists,
                    format!("schema \"{ns}\" already exists in the warehouse and holds tables that are not models: choose another schema name"),
                )));
            }
        }
        write_difference(conn, &old, &new).await?;
        Ok(Ok(Committed {
            dropped: old
                .dropped_folders(&new)
                .into_iter()
                .filter(|f| self.owns_folder(f))
                .collect(),
            state: Arc::new(new),
        }))
    }

    /// The models as the connection sees them.
    async fn read(&self, conn: &mut SqliteConnection) -> Result<ModelsState> {
        let mut state = ModelsState::default();
        let rows = fetch(
            conn,
            &format!(
                "SELECT namespace FROM iceberg_namespace_properties
                 WHERE catalog_name = ? AND property_key = '{MODELS_PROPERTY}' AND property_value = 'true'"
            ),
            "schemas",
        )
        .await?;
        for r in rows {
            let ns = text(&r, 0, "schemas")?;
            if !self.is_protected(&ns) {
                state.namespaces.insert(ns);
            }
        }
        let rows = fetch(
            conn,
            "SELECT table_namespace, table_name, metadata_location FROM iceberg_tables
             WHERE catalog_name = ? AND (iceberg_type = 'TABLE' OR iceberg_type IS NULL)
             AND metadata_location IS NOT NULL",
            "tables",
        )
        .await?;
        for r in rows {
            let ns = text(&r, 0, "tables")?;
            if state.namespaces.contains(&ns) {
                state
                    .tables
                    .insert((ns, text(&r, 1, "tables")?), text(&r, 2, "tables")?);
            }
        }
        let sql = "SELECT namespace, name, definition FROM skippr_views WHERE catalog_name = ?";
        for r in fetch(conn, sql, "views").await? {
            let (ns, name) = (text(&r, 0, "views")?, text(&r, 1, "views")?);
            let def: ViewDef = serde_json::from_str(&text(&r, 2, "views")?).with_context(|| {
                format!("view {ns}.{name} in the catalog is damaged: drop it and create it again")
            })?;
            if state.namespaces.contains(&ns) {
                state.views.insert((ns, name), def);
            }
        }
        let sql = "SELECT namespace, relation, column_name, comment FROM skippr_comments WHERE catalog_name = ?";
        for r in fetch(conn, sql, "comments").await? {
            let key = (
                text(&r, 0, "comments")?,
                text(&r, 1, "comments")?,
                text(&r, 2, "comments")?,
            );
            if state.namespaces.contains(&key.0) {
                state.comments.insert(key, text(&r, 3, "comments")?);
            }
        }
        Ok(state)
    }
}

/// The rows of a query of the catalog (its one parameter is the catalog's name).
async fn fetch(conn: &mut SqliteConnection, sql: &str, what: &str) -> Result<Vec<SqliteRow>> {
    sqlx::query(sql)
        .bind(CATALOG_NAME)
        .fetch_all(conn)
        .await
        .with_context(|| format!("reading the models' {what} from the catalog"))
}

/// Column `i` of a catalog row, as text.
fn text(row: &SqliteRow, i: usize, what: &str) -> Result<String> {
    row.try_get(i)
        .with_context(|| format!("reading the models' {what} from the catalog"))
}

/// The namespace an op changes.
fn namespace_of(op: &Op) -> Option<&str> {
    Some(match op {
        Op::CreateNamespace(ns) | Op::DropNamespace(ns) => ns,
        Op::CreateTable { rel, .. }
        | Op::SwapTable { rel, .. }
        | Op::CreateView { rel, .. }
        | Op::Rename { rel, .. }
        | Op::Drop { rel, .. }
        | Op::Comment { rel, .. } => &rel.0,
    })
}

/// Runs one statement of a commit with text arguments (the catalog's name first).
async fn run(conn: &mut SqliteConnection, sql: &str, args: &[&str]) -> Result<()> {
    let mut query = sqlx::query(sql).bind(CATALOG_NAME);
    for a in args {
        query = query.bind(*a);
    }
    query
        .execute(conn)
        .await
        .context("writing the models to the catalog")?;
    Ok(())
}

/// Writes what differs between `old` and `new` (both read in this transaction).
async fn write_difference(
    conn: &mut SqliteConnection,
    old: &ModelsState,
    new: &ModelsState,
) -> Result<()> {
    for ns in old.namespaces.difference(&new.namespaces) {
        run(
            conn,
            "DELETE FROM iceberg_namespace_properties WHERE catalog_name = ? AND namespace = ?",
            &[ns],
        )
        .await?;
    }
    for ns in new.namespaces.difference(&old.namespaces) {
        for key in ["exists", MODELS_PROPERTY] {
            run(
                conn,
                "INSERT INTO iceberg_namespace_properties (catalog_name, namespace, property_key, property_value)
                 VALUES (?, ?, ?, 'true')",
                &[ns, key],
            )
            .await?;
        }
    }
    for (rel, location) in &old.tables {
        match new.tables.get(rel) {
            Some(l) if l == location => {}
            Some(l) => {
                run(
                    conn,
                    "UPDATE iceberg_tables SET metadata_location = ?2, previous_metadata_location = ?3
                     WHERE catalog_name = ?1 AND table_namespace = ?4 AND table_name = ?5",
                    &[l, location, &rel.0, &rel.1],
                )
                .await?
            }
            None => {
                run(
                    conn,
                    "DELETE FROM iceberg_tables WHERE catalog_name = ? AND table_namespace = ? AND table_name = ?",
                    &[&rel.0, &rel.1],
                )
                .await?
            }
        }
    }
    for (rel, location) in new
        .tables
        .iter()
        .filter(|(r, _)| !old.tables.contains_key(*r))
    {
        run(
            conn,
            "INSERT INTO iceberg_tables (catalog_name, table_namespace, table_name, metadata_location, previous_metadata_location, iceberg_type)
             VALUES (?, ?, ?, ?, NULL, 'TABLE')",
            &[&rel.0, &rel.1, location],
        )
        .await?;
    }
    for rel in old.views.keys().filter(|r| !new.views.contains_key(*r)) {
        run(
            conn,
            "DELETE FROM skippr_views WHERE catalog_name = ? AND namespace = ? AND name = ?",
            &[&rel.0, &rel.1],
        )
        .await?;
    }
    for (rel, def) in new
        .views
        .iter()
        .filter(|(r, d)| old.views.get(*r) != Some(*d))
    {
        run(
            conn,
            "INSERT OR REPLACE INTO skippr_views (catalog_name, namespace, name, definition) VALUES (?, ?, ?, ?)",
            &[&rel.0, &rel.1, &serde_json::to_string(def)?],
        )
        .await?;
    }
    for key in old
        .comments
        .keys()
        .filter(|k| !new.comments.contains_key(*k))
    {
        run(
            conn,
            "DELETE FROM skippr_comments WHERE catalog_name = ? AND namespace = ? AND relation = ? AND column_name = ?",
            &[&key.0, &key.1, &key.2],
        )
        .await?;
    }
    for (key, text) in new
        .comments
        .iter()
        .filter(|(k, t)| old.comments.get(*k) != Some(*t))
    {
        run(
            conn,
            "INSERT OR REPLACE INTO skippr_comments (catalog_name, namespace, relation, column_name, comment) VALUES (?, ?, ?, ?, ?)",
            &[&key.0, &key.1, &key.2, text],
        )
        .await?;
    }
    Ok(())
}
