//! Sources: where changes come from. Postgres is the first.

pub mod postgres;
