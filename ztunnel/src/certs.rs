//! certs (being written)
