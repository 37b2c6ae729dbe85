//! `networking.istio.io` VirtualService: the HTTP part waypoints apply (matches, weighted
//! destinations, timeouts, retries, fault injection, header changes, redirects, mirrors).
//! Fields in the API's camelCase; unknown fields are ignored.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ObjectMeta;

/// `networking.istio.io` VirtualService.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VirtualService {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: VirtualServiceSpec,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct VirtualServiceSpec {
    #[serde(default)]
    pub hosts: Vec<String>,
    #[serde(default)]
    pub gateways: Vec<String>,
    #[serde(default)]
    pub http: Vec<VsHttpRoute>,
}

/// `exact`, `prefix` or `regex` (one of them).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct StringMatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct VsHttpMatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<StringMatch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<StringMatch>,
    #[serde(default)]
    pub headers: BTreeMap<String, StringMatch>,
    #[serde(default)]
    pub query_params: BTreeMap<String, StringMatch>,
    #[serde(default)]
    pub ignore_uri_case: bool,
    /// The port the request came in on (a service's, or a gateway server's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
    /// The gateways (or `mesh`) this match applies on; empty: all the VirtualService's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gateways: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct PortSelector {
    #[serde(default)]
    pub number: u16,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Destination {
    #[serde(default)]
    pub host: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subset: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<PortSelector>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct HeaderOperations {
    #[serde(default)]
    pub set: BTreeMap<String, String>,
    #[serde(default)]
    pub add: BTreeMap<String, String>,
    #[serde(default)]
    pub remove: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Headers {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<HeaderOperations>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<HeaderOperations>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct RouteDestination {
    #[serde(default)]
    pub destination: Destination,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<Headers>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct HttpRetry {
    #[serde(default)]
    pub attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_try_timeout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_on: Option<String>,
}

/// `percentage: {value: 50}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Percent {
    #[serde(default)]
    pub value: f64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct FaultDelay {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fixed_delay: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percentage: Option<Percent>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct FaultAbort {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_status: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percentage: Option<Percent>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct HttpFaultInjection {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay: Option<FaultDelay>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abort: Option<FaultAbort>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct HttpRedirect {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authority: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirect_code: Option<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct VsHttpRoute {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, rename = "match")]
    pub matches: Vec<VsHttpMatch>,
    #[serde(default)]
    pub route: Vec<RouteDestination>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirect: Option<HttpRedirect>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<HttpRetry>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<HttpFaultInjection>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<Headers>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror: Option<Destination>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror_percentage: Option<Percent>,
}
