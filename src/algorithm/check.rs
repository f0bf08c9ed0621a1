//! Schedule checker.
