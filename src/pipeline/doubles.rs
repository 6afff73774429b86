//! In-memory doubles of the pipeline seams, for the unit tests.
