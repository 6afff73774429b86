//! The Postgres source: discovery, the consistent snapshot, and (later in the flow) the
//! logical replication stream.

pub mod carried;
pub mod connect;
pub mod copy;
pub mod discover;
pub mod key_chunks;
pub mod pgoutput;
pub mod relation;
pub mod schema;
pub mod slot;
pub mod snapshot;
pub mod stream;
pub mod tls;
pub mod tunnel;
