//! ca (being written)
