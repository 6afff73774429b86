//! Unit tests of the orchestration with the doubles.
