//! mesh-grpc: the gRPC client the proxies use towards istiod, straight over `h2`.
//!
//! ztunnel and pilot-agent make two kinds of calls to istiod: the delta ADS stream (one per
//! proxy, long-lived, with initial responses of many megabytes in large meshes) and the CA's
//! `CreateCertificate` (unary, a few per workload identity per day). Both need little of a gRPC
//! stack: one HTTP/2 connection dialed lazily and again after it broke, protobuf messages framed
//! uncompressed, metadata headers, `grpc-timeout`, and the status read from the trailers.
//!
//! - [`Endpoint`] parses the address (`https://host:port` verified against a PEM root file,
//!   or `http://host:port`) and makes a [`Channel`].
//! - [`Channel::unary`] and [`Channel::streaming`] make calls; [`Status`] is how one ended badly.
//! - A connection that died silently is noticed ([`keepalive`]): TCP keepalive, and HTTP/2
//!   PINGs while a call is open.
//! - Received messages are decoded from the DATA chunks as they came ([`framing`]): no stream
//!   keeps a buffer the size of the largest message it ever read.

pub mod framing;
pub mod keepalive;

mod channel;
mod endpoint;
mod status;
mod token;

pub use channel::{Channel, RequestSink, ResponseStream};
pub use endpoint::{
    Endpoint, SetupError, TlsConnector, DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_MESSAGE,
};
pub use status::{Code, Status};
pub use token::{bearer_token, TokenError};
