//! Gateway, models, names: how a statement's relation names are read before anything
//! plans it. A database part is accepted whatever it says (`"db"."schema"."table"`, as dbt
//! writes every name), an unqualified name of one of the session's temporary tables means
//! that table (Postgres searches `pg_temp` first), an unqualified `pg_stat_activity` the
//! catalog's (Postgres searches `pg_catalog` before the path), and a view's query has its names
//! qualified with the schema they meant when it was created, so that it means the same
//! later from any session.

use std::collections::HashSet;
use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    visit_relations_mut, CommentObject, Expr, Ident, ObjectName, ObjectNamePart, Query, Statement,
    Visit, VisitMut, Visitor, VisitorMut,
};

use crate::catalog::models::RelName;

/// An identifier as Postgres folds it: unquoted ones to lower case.
pub fn fold(ident: &Ident) -> String {
    if ident.quote_style.is_some() {
        ident.value.clone()
    } else {
        ident.value.to_lowercase()
    }
}

/// The identifiers of a name, folded.
pub fn parts(name: &ObjectName) -> Vec<String> {
    name.0
        .iter()
        .map(|p| match p {
            ObjectNamePart::Identifier(i) => fold(i),
            other => other.to_string(),
        })
        .collect()
}

/// The relation a name means: `name` in `default_schema`, `schema.name`, or
/// `database.schema.name` (any database).
pub fn relation(name: &ObjectName, default_schema: &str) -> Option<RelName> {
    match parts(name).as_slice() {
        [n] => Some((default_schema.to_string(), n.clone())),
        [s, n] | [_, s, n] => Some((s.clone(), n.clone())),
        _ => None,
    }
}

fn ident(value: &str) -> ObjectNamePart {
    ObjectNamePart::Identifier(Ident::with_quote('"', value))
}

/// Every CTE name of `statement` (at any depth), folded: an unqualified name equal to one
/// of them reads the CTE, not a relation.
fn cte_names<V: Visit>(node: &V) -> HashSet<String> {
    struct Ctes(HashSet<String>);
    impl Visitor for Ctes {
        type Break = ();
        fn pre_visit_query(&mut self, q: &Query) -> ControlFlow<()> {
            if let Some(with) = &q.with {
                for cte in &with.cte_tables {
                    self.0.insert(fold(&cte.alias.name));
                }
            }
            ControlFlow::Continue(())
        }
    }
    let mut v = Ctes(HashSet::new());
    let _ = node.visit(&mut v);
    v.0
}

/// Drops the database part of three-part names (and of four-part column references).
fn strip_database(name: &mut ObjectName) {
    if name.0.len() == 3 {
        name.0.remove(0);
    }
}

/// Names of a statement that are not visited as relations by the parser's visitor.
fn ddl_names(statement: &mut Statement) -> Vec<&mut ObjectName> {
    match statement {
        Statement::CreateView(v) => vec![&mut v.name],
        Statement::Drop { names, .. } => names.iter_mut().collect(),
        _ => Vec::new(),
    }
}

/// Catalog relations of the gateway's own that an unqualified name means (the compatibility
/// parser qualifies those of its own catalog).
const GATEWAY_CATALOG_RELATIONS: [&str; 1] = ["pg_stat_activity"];

/// Reads the names of `statement` as Postgres would for this session: database parts
/// dropped, unqualified names of its temporary tables (`temp`, folded) qualified with
/// `temp_schema`, and of the gateway's catalog relations with `pg_catalog`.
pub fn normalize(statement: &mut Statement, temp: &HashSet<String>, temp_schema: &str) {
    let ctes = cte_names(statement);
    let qualify = |name: &mut ObjectName| {
        strip_database(name);
        if let [only] = parts(name).as_slice() {
            if ctes.contains(only) {
                return;
            }
            if temp.contains(only) {
                name.0.insert(0, ident(temp_schema));
            } else if GATEWAY_CATALOG_RELATIONS.contains(&only.as_str()) {
                name.0
                    .insert(0, ObjectNamePart::Identifier(Ident::new("pg_catalog")));
            }
        }
    };
    let _ = visit_relations_mut(statement, |name| {
        qualify(name);
        ControlFlow::<()>::Continue(())
    });
    for name in ddl_names(statement) {
        qualify(name);
    }
    if let Statement::Comment {
        object_name,
        object_type,
        ..
    } = statement
    {
        // COMMENT ON COLUMN names the column last: its database part is the fourth.
        let parts = match object_type {
            CommentObject::Column => 4,
            _ => 3,
        };
        if object_name.0.len() == parts {
            object_name.0.remove(0);
        }
    }
    struct Columns;
    impl VisitorMut for Columns {
        type Break = ();
        fn pre_visit_expr(&mut self, e: &mut Expr) -> ControlFlow<()> {
            if let Expr::CompoundIdentifier(idents) = e {
                if idents.len() == 4 {
                    idents.remove(0);
                }
            }
            ControlFlow::Continue(())
        }
    }
    let _ = statement.visit(&mut Columns);
}

/// Qualifies every unqualified relation name of a view's query with `schema` (the one it
/// meant when the view was created) and returns the relations it reads. `None` when it
/// reads a temporary table (`temp_schema`), which a view that outlives the session cannot.
pub fn qualify_view(query: &mut Query, schema: &str, temp_schema: &str) -> Option<Vec<RelName>> {
    let ctes = cte_names(query);
    let mut depends: Vec<RelName> = Vec::new();
    let mut temporary = false;
    let _ = visit_relations_mut(query, |name| {
        let p = parts(name);
        match p.as_slice() {
            [only] if ctes.contains(only) => {}
            [only] => {
                name.0.insert(0, ident(schema));
                depends.push((schema.to_string(), only.clone()));
            }
            [s, n] => {
                temporary |= s == temp_schema;
                depends.push((s.clone(), n.clone()));
            }
            _ => {}
        }
        ControlFlow::<()>::Continue(())
    });
    if temporary {
        return None;
    }
    depends.sort();
    depends.dedup();
    Some(depends)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
    use datafusion::sql::sqlparser::parser::Parser;

    fn parse(sql: &str) -> Statement {
        Parser::parse_sql(&PostgreSqlDialect {}, sql)
            .ok()
            .and_then(|mut s| s.pop())
            .unwrap_or(Statement::Commit {
                chain: false,
                end: false,
                modifier: None,
            })
    }

    #[test]
    fn database_parts_go_and_temporary_tables_come_first() {
        let temp = HashSet::from(["t__dbt_tmp1".to_string()]);
        let mut s = parse(
            r#"insert into "db"."m"."t" ("id") (select "id" from "t__dbt_tmp1" where "db"."m"."t".id > 0)"#,
        );
        normalize(&mut s, &temp, "pg_temp_3");
        assert_eq!(
            s.to_string(),
            r#"INSERT INTO "m"."t" ("id") (SELECT "id" FROM "pg_temp_3"."t__dbt_tmp1" WHERE "m"."t".id > 0)"#
        );
        let mut s = parse("select pid from pg_stat_activity");
        normalize(&mut s, &temp, "pg_temp_3");
        assert_eq!(s.to_string(), "SELECT pid FROM pg_catalog.pg_stat_activity");
        let mut s = parse(r#"drop table if exists "db"."m"."x" cascade"#);
        normalize(&mut s, &temp, "pg_temp_3");
        assert_eq!(s.to_string(), r#"DROP TABLE IF EXISTS "m"."x" CASCADE"#);
        // A CTE of the same name is the CTE.
        let mut s = parse("with t__dbt_tmp1 as (select 1) select * from t__dbt_tmp1");
        normalize(&mut s, &temp, "pg_temp_3");
        assert_eq!(
            s.to_string(),
            "WITH t__dbt_tmp1 AS (SELECT 1) SELECT * FROM t__dbt_tmp1"
        );
    }

    #[test]
    fn a_view_keeps_the_schema_it_meant() {
        let Statement::Query(mut q) =
            parse("with s as (select * from orders) select * from s join other.c on true")
        else {
            panic!("not a query")
        };
        let depends = qualify_view(&mut q, "analytics", "pg_temp_1");
        assert_eq!(
            depends,
            Some(vec![
                ("analytics".to_string(), "orders".to_string()),
                ("other".to_string(), "c".to_string())
            ])
        );
        assert!(q.to_string().contains(r#""analytics".orders"#));
        let Statement::Query(mut q) = parse("select * from pg_temp_1.t") else {
            panic!("not a query")
        };
        assert_eq!(qualify_view(&mut q, "analytics", "pg_temp_1"), None);
    }
}
