//! Packing Envoy messages into `Any` and small builders shared by the generators.

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
