//! Proxy tests: unit tests of routing and headers, and in-process flows on loopback (each pod
//! proxy on its own 127.x address, original destinations from [`StaticOriginalDst`],
//! certificates from a [`mesh_testutil::TestPki`]-backed CA client).

mod fixture;
mod flows;
mod policy_flows;
mod unit;
