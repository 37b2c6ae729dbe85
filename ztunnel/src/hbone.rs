//! hbone (being written)
