//! Naming a source table: `schema.name`, how it is quoted in SQL, and the Iceberg table it
//! becomes. Part of the neutral change model every stage speaks.

use std::fmt;

/// A table to follow, as `schema.name`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TableRef {
    pub schema: String,
    pub name: String,
}

impl TableRef {
    /// Parses `name` (schema `public`) or `schema.name`.
    pub fn parse(s: &str) -> Option<Self> {
        let mut parts = s.split('.');
        let (schema, name) = match (parts.next(), parts.next(), parts.next()) {
            (Some(n), None, _) => ("public", n),
            (Some(s), Some(n), None) => (s, n),
            _ => return None,
        };
        if !is_identifier(schema) || !is_identifier(name) {
            return None;
        }
        Some(Self {
            schema: schema.to_string(),
            name: name.to_string(),
        })
    }

    /// The Iceberg table name: the table name in `public`, `<schema>_<name>` elsewhere.
    pub fn iceberg_name(&self) -> String {
        if self.schema == "public" {
            self.name.clone()
        } else {
            format!("{}_{}", self.schema, self.name)
        }
    }

    /// The table as a key under `pipelines.<p>.tables` names it: `name` in `public` (as
    /// users write it), `schema.name` elsewhere.
    pub fn config_key(&self) -> String {
        if self.schema == "public" {
            self.name.clone()
        } else {
            self.to_string()
        }
    }

    /// Quoted for SQL: `"schema"."name"`.
    pub fn quoted(&self) -> String {
        format!("{}.{}", quote_ident(&self.schema), quote_ident(&self.name))
    }
}

impl fmt::Display for TableRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.schema, self.name)
    }
}

/// Quotes a SQL identifier.
pub fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

pub fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_alphabetic() || c == '_')
        && chars.all(|c| c.is_alphanumeric() || c == '_' || c == '$')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_keys_name_tables_as_users_write_them() {
        let public = TableRef::parse("public.orders").expect("a table name");
        assert_eq!(public.config_key(), "orders");
        assert_eq!(public, TableRef::parse("orders").expect("a table name"));
        let other = TableRef::parse("sales.orders").expect("a table name");
        assert_eq!(other.config_key(), "sales.orders");
        assert_eq!(other.iceberg_name(), "sales_orders");
    }
}
