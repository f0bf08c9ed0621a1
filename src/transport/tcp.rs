//! TCP links.
