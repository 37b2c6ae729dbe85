//! `networking.istio.io` Sidecar: which services a sidecar proxy is configured to call (egress
//! listeners with `namespace/host` patterns), which ports it accepts and where it hands them
//! (ingress listeners), and what happens to destinations outside the registry. Fields in the
//! API's camelCase; unknown fields are ignored.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ObjectMeta;

/// `networking.istio.io` Sidecar.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sidecar {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: SidecarSpec,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SidecarSpec {
    /// The pods (in the Sidecar's namespace) it applies to; none: every pod of the namespace
    /// (or, in the root namespace, of the mesh) without a more specific Sidecar.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_selector: Option<SidecarWorkloadSelector>,
    /// Ports the proxy accepts and hands to the application.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ingress: Vec<IstioIngressListener>,
    /// The services the proxy may call; none given: every service (`*/*`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<IstioEgressListener>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outbound_traffic_policy: Option<OutboundTrafficPolicy>,
    /// Connection pool towards the application (kept as written; not applied).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inbound_connection_pool: Option<serde_json::Value>,
}

/// `workloadSelector: {labels: {...}}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SidecarWorkloadSelector {
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// A port of a Sidecar listener.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SidecarPort {
    #[serde(default)]
    pub number: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_port: Option<u32>,
}

/// How a listener's traffic reaches the proxy: `DEFAULT` (the capture the pod was injected
/// with), `IPTABLES` (redirected by the capture rules) or `NONE` (not captured: the
/// application connects to the listener's `bind` address itself). Variants carry no doc
/// comments, which would turn the CRD schema's enum into a `oneOf`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum CaptureMode {
    #[default]
    Default,
    Iptables,
    None,
}

/// Which services a sidecar may call on a port (or, without a port, on every other port).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct IstioEgressListener {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<SidecarPort>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub bind: String,
    #[serde(default)]
    pub capture_mode: CaptureMode,
    /// `namespace/dnsName`: namespace `*` (any), `.` (the Sidecar's), `~` (none); the name a
    /// hostname, `*.suffix`, or `*`.
    #[serde(default)]
    pub hosts: Vec<String>,
}

/// A port the sidecar accepts, and the application endpoint it forwards to.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct IstioIngressListener {
    #[serde(default)]
    pub port: SidecarPort,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub bind: String,
    #[serde(default)]
    pub capture_mode: CaptureMode,
    /// `127.0.0.1:<port>`, `0.0.0.0:<port>` or `unix://<path>`; empty: the original
    /// destination's port.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub default_endpoint: String,
    /// Server TLS settings (kept as written; not applied).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<serde_json::Value>,
    /// Connection pool towards the application (kept as written; not applied).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_pool: Option<serde_json::Value>,
}

/// What happens to connections for destinations the proxy has no configuration for.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct OutboundTrafficPolicy {
    #[serde(default)]
    pub mode: OutboundTrafficMode,
    /// A proxy for unknown destinations (kept as written; not applied).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_proxy: Option<serde_json::Value>,
}

/// `REGISTRY_ONLY` (only destinations in the service registry; others reach a black hole) or
/// `ALLOW_ANY` (unknown destinations pass through to their original address). As in Istio's
/// API, `REGISTRY_ONLY` is the zero value, so `outboundTrafficPolicy: {}` blocks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum OutboundTrafficMode {
    #[default]
    RegistryOnly,
    AllowAny,
}
