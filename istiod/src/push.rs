//! push (being written)
