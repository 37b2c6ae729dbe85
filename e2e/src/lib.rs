//! End-to-end harness: clusters of network namespaces on one machine (from
//! `mesh_testutil::netns`) running the real binaries -- istiod, and one ztunnel per node --
//! as processes, with the node agent's side of ZDS played by `mesh_testutil::FakeZds` until
//! cni-node exists. Everything it starts is stopped when its handle drops.
//!
//! The binaries are found next to the test executable (`target/<profile>/`), so build them
//! first: `cargo build --workspace --bins` (`scripts/test.sh` does).

pub mod bins;
pub mod cluster;
pub mod cni;
pub mod controller;
pub mod http;
pub mod injection;
pub mod inspect;
pub mod istiod;
pub mod kubelet;
pub mod load;
pub mod probe;
pub mod process;
pub mod procfs;
pub mod waypoint;
pub mod ztunnel;

pub use istiod::Istiod;
pub use ztunnel::Ztunnel;
