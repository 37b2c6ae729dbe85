//! mesh-testutil
