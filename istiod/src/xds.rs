//! xds (being written)
