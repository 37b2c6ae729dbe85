//! auth (being written)
