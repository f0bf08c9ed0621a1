//! In-process links.
