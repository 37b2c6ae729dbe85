//! `networking.istio.io` Gateway: the servers (port, hosts, TLS) a gateway proxy exposes, on the
//! proxies whose pod labels its `selector` names. VirtualServices attach to it through their
//! `gateways` field. Fields in the API's camelCase; unknown fields are ignored. Not to be
//! confused with the Gateway API's Gateway ([`crate::Gateway`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ObjectMeta;

/// `networking.istio.io` Gateway.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IstioGateway {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: IstioGatewaySpec,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct IstioGatewaySpec {
    /// What the gateway proxies selected by `selector` listen for.
    #[serde(default)]
    pub servers: Vec<GatewayServer>,
    /// Pod labels of the gateway proxies this Gateway applies to (in any namespace); empty:
    /// every gateway proxy.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub selector: BTreeMap<String, String>,
}

/// One server of a Gateway.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct GatewayServer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<GatewayServerPort>,
    /// An address to bind to instead of every address.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub bind: String,
    /// `host`, `*.suffix`, `*`, each optionally `namespace/` prefixed (`./`, `*/`).
    #[serde(default)]
    pub hosts: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<GatewayServerTls>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// The gateway's default HTTP endpoint settings (kept as written; not applied).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_endpoint: Option<String>,
}

/// `port` of a Gateway server.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct GatewayServerPort {
    #[serde(default)]
    pub number: u32,
    /// HTTP, HTTPS, GRPC, HTTP2, MONGO, TCP or TLS (case-insensitive).
    #[serde(default)]
    pub protocol: String,
    #[serde(default)]
    pub name: String,
    /// Deprecated in Istio; kept as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_port: Option<u32>,
}

/// `tls` of a Gateway server.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct GatewayServerTls {
    /// Plain HTTP requests are answered with a redirect to HTTPS.
    #[serde(default)]
    pub https_redirect: bool,
    /// PASSTHROUGH, SIMPLE, MUTUAL, AUTO_PASSTHROUGH, ISTIO_MUTUAL, OPTIONAL_MUTUAL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_certificate: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_certificates: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subject_alt_names: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_protocol_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_protocol_version: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cipher_suites: Vec<String>,
}
