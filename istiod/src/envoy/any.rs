//! Packing Envoy messages into `Any` and small builders shared by the generators.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::sync::LazyLock;

use mesh_proto::envoy::pb::google::protobuf::{Any, Duration as PbDuration};
use prost::{Message, Name};

/// `message` as an `Any` with its canonical type URL.
pub fn pack<M: Message + Name>(message: &M) -> Any {
    Any {
        type_url: M::type_url(),
        value: message.encode_to_vec(),
    }
}

/// The wire bytes of a resource.
pub fn encode<M: Message>(message: &M) -> Vec<u8> {
    message.encode_to_vec()
}

/// `namespace/name` of an object, as problems name it (`default` when the namespace is unset).
pub fn object_name(meta: &mesh_api::ObjectMeta) -> String {
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or("default"),
        meta.name.as_deref().unwrap_or_default()
    )
}

/// A protobuf Duration.
pub fn duration(d: std::time::Duration) -> PbDuration {
    PbDuration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

/// A `google.protobuf.UInt32Value`.
pub fn u32_value(v: u32) -> mesh_proto::envoy::pb::google::protobuf::UInt32Value {
    mesh_proto::envoy::pb::google::protobuf::UInt32Value { value: v }
}

/// A `google.protobuf.BoolValue`.
pub fn bool_value(v: bool) -> mesh_proto::envoy::pb::google::protobuf::BoolValue {
    mesh_proto::envoy::pb::google::protobuf::BoolValue { value: v }
}

/// An ADS config source (`ads: {}`, resource API v3).
pub fn ads_source() -> mesh_proto::envoy::pb::envoy::config::core::v3::ConfigSource {
    use mesh_proto::envoy::pb::envoy::config::core::v3::{
        config_source::ConfigSourceSpecifier, AggregatedConfigSource, ApiVersion, ConfigSource,
    };
    ConfigSource {
        config_source_specifier: Some(ConfigSourceSpecifier::Ads(AggregatedConfigSource {})),
        resource_api_version: ApiVersion::V3 as i32,
        ..ConfigSource::default()
    }
}

/// A proto map field (Envoy's are `HashMap`s) that encodes the same entries to the same bytes.
///
/// A `HashMap` iterates, and so encodes, in an order drawn from its own random hasher: the
/// same entries in two maps give two encodings, and the content-hash versions of resources
/// would change when nothing did (an unchanged waypoint pushed again). Maps built here share
/// one hasher and take their entries in key order, so equal maps encode equally within this
/// process. (Another istiod process encodes another order: a proxy reconnecting to another
/// replica is resent what it has.)
pub fn stable_map<V>(entries: impl IntoIterator<Item = (String, V)>) -> HashMap<String, V> {
    static HASHER: LazyLock<RandomState> = LazyLock::new(RandomState::new);
    let mut sorted: Vec<(String, V)> = entries.into_iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    sorted.dedup_by(|b, a| a.0 == b.0);
    let mut map = HashMap::with_capacity_and_hasher(sorted.len(), HASHER.clone());
    map.extend(sorted);
    map
}
