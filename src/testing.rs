//! Helpers for the unit tests of every layer (no part of the data flow itself): assertions
//! on the messages the layers write for users.

/// Asserts that `text` holds each of `words`, showing `text` when one is missing.
#[track_caller]
pub fn assert_contains(text: &str, words: &[&str]) {
    for word in words {
        assert!(text.contains(word), "`{word}` is not in: {text}");
    }
}
