//! model (being written)
