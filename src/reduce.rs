//! Reduction kernels (stub).
