//! SQLSTATE codes, named in one place: what the gateway tells clients and how source errors
//! are read (the names are Postgres's own, from its `errcodes.txt`).

/// `00000`: a notice that something was skipped.
pub const SUCCESSFUL_COMPLETION: &str = "00000";
/// `01000`: a warning (a signal sent to a process that is not a session of the gateway).
pub const WARNING: &str = "01000";
/// `08001`: the source refused a connection.
pub const SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION: &str = "08001";
/// `08006`: the connection broke.
pub const CONNECTION_FAILURE: &str = "08006";
/// `08P01`: a broken client message.
pub const PROTOCOL_VIOLATION: &str = "08P01";
/// `0A000`: what the gateway does not do.
pub const FEATURE_NOT_SUPPORTED: &str = "0A000";
/// `22000`: a value that cannot be used.
pub const DATA_EXCEPTION: &str = "22000";
/// `22012`: division by zero.
pub const DIVISION_BY_ZERO: &str = "22012";
/// `22023`: a setting or argument out of range.
pub const INVALID_PARAMETER_VALUE: &str = "22023";
/// `22P02`: text that does not read as its type.
pub const INVALID_TEXT_REPRESENTATION: &str = "22P02";
/// `23502`: a null where the column has none.
pub const NOT_NULL_VIOLATION: &str = "23502";
/// `25001`: not allowed inside a transaction.
pub const ACTIVE_SQL_TRANSACTION: &str = "25001";
/// `25006`: a write to what only reads.
pub const READ_ONLY_SQL_TRANSACTION: &str = "25006";
/// `25P01`: no transaction to end.
pub const NO_ACTIVE_SQL_TRANSACTION: &str = "25P01";
/// `25P02`: the transaction failed before.
pub const IN_FAILED_SQL_TRANSACTION: &str = "25P02";
/// `26000`: an unknown prepared statement or portal.
pub const INVALID_SQL_STATEMENT_NAME: &str = "26000";
/// `28000`: an unknown user.
pub const INVALID_AUTHORIZATION_SPECIFICATION: &str = "28000";
/// `28P01`: a wrong password.
pub const INVALID_PASSWORD: &str = "28P01";
/// `2BP01`: a drop that others depend on.
pub const DEPENDENT_OBJECTS_STILL_EXIST: &str = "2BP01";
/// `3D000`: an unknown database.
pub const INVALID_CATALOG_NAME: &str = "3D000";
/// `3F000`: an unknown schema.
pub const INVALID_SCHEMA_NAME: &str = "3F000";
/// `40001`: a conflict: try again.
pub const SERIALIZATION_FAILURE: &str = "40001";
/// `40P01`: a deadlock: try again.
pub const DEADLOCK_DETECTED: &str = "40P01";
/// `42000`: a query the engine refused.
pub const SYNTAX_ERROR_OR_ACCESS_RULE_VIOLATION: &str = "42000";
/// `42501`: not allowed for this user.
pub const INSUFFICIENT_PRIVILEGE: &str = "42501";
/// `42601`: SQL that does not parse.
pub const SYNTAX_ERROR: &str = "42601";
/// `42701`: a column named twice.
pub const DUPLICATE_COLUMN: &str = "42701";
/// `42702`: a column name two relations have.
pub const AMBIGUOUS_COLUMN: &str = "42702";
/// `42703`: an unknown column.
pub const UNDEFINED_COLUMN: &str = "42703";
/// `42704`: an unknown object.
pub const UNDEFINED_OBJECT: &str = "42704";
/// `42809`: a table where a view was named, or the reverse.
pub const WRONG_OBJECT_TYPE: &str = "42809";
/// `42883`: an unknown function.
pub const UNDEFINED_FUNCTION: &str = "42883";
/// `42P01`: an unknown relation.
pub const UNDEFINED_TABLE: &str = "42P01";
/// `42P05`: a prepared statement named twice.
pub const DUPLICATE_PREPARED_STATEMENT: &str = "42P05";
/// `42P06`: a schema that exists.
pub const DUPLICATE_SCHEMA: &str = "42P06";
/// `42P07`: a relation that exists.
pub const DUPLICATE_TABLE: &str = "42P07";
/// `42P16`: a table definition that cannot be.
pub const INVALID_TABLE_DEFINITION: &str = "42P16";
/// `42P18`: a parameter whose type cannot be told.
pub const INDETERMINATE_DATATYPE: &str = "42P18";
/// `53200`: a statement past its memory.
pub const OUT_OF_MEMORY: &str = "53200";
/// `53300`: no connection slot left.
pub const TOO_MANY_CONNECTIONS: &str = "53300";
/// `53400`: past a configured limit.
pub const CONFIGURATION_LIMIT_EXCEEDED: &str = "53400";
/// `55000`: not in the state it must be.
pub const OBJECT_NOT_IN_PREREQUISITE_STATE: &str = "55000";
/// `55006`: held by another process.
pub const OBJECT_IN_USE: &str = "55006";
/// `57014`: cancelled or past its timeout.
pub const QUERY_CANCELED: &str = "57014";
/// `57P01`: the server is shutting down.
pub const ADMIN_SHUTDOWN: &str = "57P01";
/// `57P02`: the server crashed.
pub const CRASH_SHUTDOWN: &str = "57P02";
/// `57P03`: the server is starting.
pub const CANNOT_CONNECT_NOW: &str = "57P03";
/// `72000`: a snapshot no longer held.
pub const SNAPSHOT_TOO_OLD: &str = "72000";
/// `XX000`: a bug.
pub const INTERNAL_ERROR: &str = "XX000";
