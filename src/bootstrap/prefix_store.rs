//! Prefix store (stub until implemented).
/// A view of a store with every key prefixed.
pub struct PrefixStore;
