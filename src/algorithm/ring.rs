//! Ring planners.
