//! Istio CRDs the ambient control plane reads, as serde types (fields in Istio's camelCase).
//! Unknown fields are ignored, as the API server prunes them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ObjectMeta;

macro_rules! istio_object {
    ($(#[$doc:meta])* $name:ident, $spec:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
        #[serde(rename_all = "camelCase")]
        pub struct $name {
            #[serde(default)]
            pub metadata: ObjectMeta,
            #[serde(default)]
            pub spec: $spec,
        }
    };
}

istio_object!(
    /// `security.istio.io` AuthorizationPolicy.
    AuthorizationPolicy,
    AuthorizationPolicySpec
);
istio_object!(
    /// `security.istio.io` PeerAuthentication.
    PeerAuthentication,
    PeerAuthenticationSpec
);
istio_object!(
    /// `security.istio.io` RequestAuthentication: which JWTs a workload or waypoint accepts.
    RequestAuthentication,
    RequestAuthenticationSpec
);
istio_object!(
    /// `networking.istio.io` ServiceEntry.
    ServiceEntry,
    ServiceEntrySpec
);
istio_object!(
    /// `networking.istio.io` WorkloadEntry.
    WorkloadEntry,
    WorkloadEntrySpec
);

/// `selector: {matchLabels: {...}}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct WorkloadSelector {
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
}

/// `targetRef`/`targetRefs` entries (policies attached to Gateways/Services are for waypoints).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct PolicyTargetReference {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: Option<String>,
}

/// `targetRef` then `targetRefs` (a policy may use either).
fn targets<'a>(
    one: &'a Option<PolicyTargetReference>,
    many: &'a [PolicyTargetReference],
) -> impl Iterator<Item = &'a PolicyTargetReference> {
    one.iter().chain(many)
}

impl AuthorizationPolicySpec {
    /// `targetRef` and `targetRefs` together.
    pub fn targets(&self) -> impl Iterator<Item = &PolicyTargetReference> {
        targets(&self.target_ref, &self.target_refs)
    }
}

impl RequestAuthenticationSpec {
    /// `targetRef` and `targetRefs` together.
    pub fn targets(&self) -> impl Iterator<Item = &PolicyTargetReference> {
        targets(&self.target_ref, &self.target_refs)
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AuthorizationAction {
    #[default]
    Allow,
    Deny,
    Audit,
    Custom,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct AuthorizationPolicySpec {
    #[serde(default)]
    pub selector: Option<WorkloadSelector>,
    #[serde(default)]
    pub target_ref: Option<PolicyTargetReference>,
    #[serde(default)]
    pub target_refs: Vec<PolicyTargetReference>,
    #[serde(default)]
    pub action: AuthorizationAction,
    /// `rules: null` or absent means "no rules"; `rules: [{}]` means "match everything".
    #[serde(default)]
    pub rules: Option<Vec<Rule>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Rule {
    #[serde(default)]
    pub from: Vec<RuleFrom>,
    #[serde(default)]
    pub to: Vec<RuleTo>,
    #[serde(default)]
    pub when: Vec<Condition>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct RuleFrom {
    #[serde(default)]
    pub source: Source,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct RuleTo {
    #[serde(default)]
    pub operation: Operation,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Source {
    #[serde(default)]
    pub principals: Vec<String>,
    #[serde(default)]
    pub not_principals: Vec<String>,
    #[serde(default)]
    pub request_principals: Vec<String>,
    #[serde(default)]
    pub not_request_principals: Vec<String>,
    #[serde(default)]
    pub namespaces: Vec<String>,
    #[serde(default)]
    pub not_namespaces: Vec<String>,
    #[serde(default)]
    pub service_accounts: Vec<String>,
    #[serde(default)]
    pub not_service_accounts: Vec<String>,
    #[serde(default)]
    pub ip_blocks: Vec<String>,
    #[serde(default)]
    pub not_ip_blocks: Vec<String>,
    #[serde(default)]
    pub remote_ip_blocks: Vec<String>,
    #[serde(default)]
    pub not_remote_ip_blocks: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Operation {
    #[serde(default)]
    pub hosts: Vec<String>,
    #[serde(default)]
    pub not_hosts: Vec<String>,
    #[serde(default)]
    pub ports: Vec<String>,
    #[serde(default)]
    pub not_ports: Vec<String>,
    #[serde(default)]
    pub methods: Vec<String>,
    #[serde(default)]
    pub not_methods: Vec<String>,
    #[serde(default)]
    pub paths: Vec<String>,
    #[serde(default)]
    pub not_paths: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(default)]
    pub key: String,
    #[serde(default)]
    pub values: Vec<String>,
    #[serde(default)]
    pub not_values: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct RequestAuthenticationSpec {
    #[serde(default)]
    pub selector: Option<WorkloadSelector>,
    #[serde(default)]
    pub target_ref: Option<PolicyTargetReference>,
    #[serde(default)]
    pub target_refs: Vec<PolicyTargetReference>,
    #[serde(default)]
    pub jwt_rules: Vec<JwtRule>,
}

/// One accepted token issuer (`jwtRules[]`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct JwtRule {
    #[serde(default)]
    pub issuer: String,
    #[serde(default)]
    pub audiences: Vec<String>,
    #[serde(default)]
    pub jwks_uri: String,
    /// An inline JSON Web Key Set.
    #[serde(default)]
    pub jwks: String,
    #[serde(default)]
    pub from_headers: Vec<JwtHeader>,
    #[serde(default)]
    pub from_params: Vec<String>,
    #[serde(default)]
    pub from_cookies: Vec<String>,
    #[serde(default)]
    pub output_payload_to_header: String,
    #[serde(default)]
    pub output_claim_to_headers: Vec<ClaimToHeader>,
    #[serde(default)]
    pub forward_original_token: bool,
    /// A duration (`5s`): how long fetching the key set may take.
    #[serde(default)]
    pub timeout: Option<String>,
}

/// Where a token is read from: a header, after `prefix` (`Bearer `).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct JwtHeader {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub prefix: String,
}

/// A claim copied into a request header.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ClaimToHeader {
    #[serde(default)]
    pub header: String,
    #[serde(default)]
    pub claim: String,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum MtlsMode {
    #[default]
    Unset,
    Disable,
    Permissive,
    Strict,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct PeerAuthenticationMtls {
    #[serde(default)]
    pub mode: MtlsMode,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct PeerAuthenticationSpec {
    #[serde(default)]
    pub selector: Option<WorkloadSelector>,
    #[serde(default)]
    pub mtls: Option<PeerAuthenticationMtls>,
    /// Keyed by port number (as a string in YAML/JSON).
    #[serde(default)]
    pub port_level_mtls: BTreeMap<String, PeerAuthenticationMtls>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ServiceEntryLocation {
    #[default]
    MeshExternal,
    MeshInternal,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ServiceEntryResolution {
    #[default]
    None,
    Static,
    Dns,
    DnsRoundRobin,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ServicePort {
    pub number: u32,
    #[serde(default)]
    pub protocol: Option<String>,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub target_port: Option<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ServiceEntrySpec {
    #[serde(default)]
    pub hosts: Vec<String>,
    #[serde(default)]
    pub addresses: Vec<String>,
    #[serde(default)]
    pub ports: Vec<ServicePort>,
    #[serde(default)]
    pub location: ServiceEntryLocation,
    #[serde(default)]
    pub resolution: ServiceEntryResolution,
    #[serde(default)]
    pub endpoints: Vec<WorkloadEntrySpec>,
    #[serde(default)]
    pub workload_selector: Option<WorkloadEntrySelector>,
    #[serde(default)]
    pub export_to: Vec<String>,
    #[serde(default)]
    pub subject_alt_names: Vec<String>,
}

/// `workloadSelector: {labels: {...}}` of a ServiceEntry.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct WorkloadEntrySelector {
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct WorkloadEntrySpec {
    #[serde(default)]
    pub address: String,
    #[serde(default)]
    pub ports: BTreeMap<String, u32>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub network: String,
    #[serde(default)]
    pub locality: String,
    #[serde(default)]
    pub weight: Option<u32>,
    #[serde(default)]
    pub service_account: String,
}
