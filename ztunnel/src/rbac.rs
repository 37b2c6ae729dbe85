//! rbac (being written)
