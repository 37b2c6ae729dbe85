//! TLS for HBONE: the waypoint's certificate (`default`) and the mesh roots (`ROOTCA`) come
//! from SDS on the proxy's agent; peers must present a SPIFFE id of the mesh's trust domain.

use mesh_proto::envoy::pb::envoy::config::core::v3::{
    config_source::ConfigSourceSpecifier, grpc_service, ApiConfigSource, ApiVersion, ConfigSource,
    GrpcService, TransportSocket,
};
use mesh_proto::envoy::pb::envoy::extensions::transport_sockets::tls::v3::{
    common_tls_context::{CombinedCertificateValidationContext, ValidationContextType},
    subject_alt_name_matcher::SanType,
    tls_parameters::TlsProtocol,
    CertificateValidationContext, CommonTlsContext, DownstreamTlsContext, SdsSecretConfig,
    SubjectAltNameMatcher, TlsParameters, UpstreamTlsContext,
};
use mesh_proto::envoy::pb::envoy::r#type::matcher::v3::{string_matcher, StringMatcher};

use super::any::{bool_value, pack};
use super::names;

/// An SDS secret served by the agent over the bootstrap's `sds-grpc` cluster.
fn sds(name: &str) -> SdsSecretConfig {
    SdsSecretConfig {
        name: name.to_string(),
        sds_config: Some(ConfigSource {
            config_source_specifier: Some(ConfigSourceSpecifier::ApiConfigSource(
                ApiConfigSource {
                    api_type: mesh_proto::envoy::pb::envoy::config::core::v3::api_config_source::ApiType::Grpc as i32,
                    transport_api_version: ApiVersion::V3 as i32,
                    set_node_on_first_message_only: true,
                    grpc_services: vec![GrpcService {
                        target_specifier: Some(grpc_service::TargetSpecifier::EnvoyGrpc(
                            grpc_service::EnvoyGrpc {
                                cluster_name: names::SDS_CLUSTER.to_string(),
                                ..grpc_service::EnvoyGrpc::default()
                            },
                        )),
                        ..GrpcService::default()
                    }],
                    ..ApiConfigSource::default()
                },
            )),
            resource_api_version: ApiVersion::V3 as i32,
            ..ConfigSource::default()
        }),
    }
}

/// TLS 1.3, ALPN h2, our certificate, peers verified against the roots and the trust domain.
fn common(trust_domain: &str) -> CommonTlsContext {
    let san = SubjectAltNameMatcher {
        san_type: SanType::Uri as i32,
        matcher: Some(StringMatcher {
            match_pattern: Some(string_matcher::MatchPattern::Prefix(format!(
                "spiffe://{trust_domain}/"
            ))),
            ..StringMatcher::default()
        }),
        ..SubjectAltNameMatcher::default()
    };
    CommonTlsContext {
        tls_params: Some(TlsParameters {
            tls_minimum_protocol_version: TlsProtocol::TlSv13 as i32,
            tls_maximum_protocol_version: TlsProtocol::TlSv13 as i32,
            ..TlsParameters::default()
        }),
        alpn_protocols: vec!["h2".to_string()],
        tls_certificate_sds_secret_configs: vec![sds(names::SECRET_DEFAULT)],
        validation_context_type: Some(ValidationContextType::CombinedValidationContext(
            CombinedCertificateValidationContext {
                default_validation_context: Some(CertificateValidationContext {
                    match_typed_subject_alt_names: vec![san],
                    ..CertificateValidationContext::default()
                }),
                validation_context_sds_secret_config: Some(sds(names::SECRET_ROOTCA)),
                ..CombinedCertificateValidationContext::default()
            },
        )),
        ..CommonTlsContext::default()
    }
}

/// The server side of HBONE (`connect_terminate`): a client certificate is required.
pub fn hbone_server(trust_domain: &str) -> TransportSocket {
    let ctx = DownstreamTlsContext {
        common_tls_context: Some(common(trust_domain)),
        require_client_certificate: Some(bool_value(true)),
        ..DownstreamTlsContext::default()
    };
    transport_socket(pack(&ctx))
}

/// The client side of HBONE (`connect_originate`), towards a pod's ztunnel.
pub fn hbone_client(trust_domain: &str) -> TransportSocket {
    let ctx = UpstreamTlsContext {
        common_tls_context: Some(common(trust_domain)),
        ..UpstreamTlsContext::default()
    };
    transport_socket(pack(&ctx))
}

fn transport_socket(config: mesh_proto::envoy::pb::google::protobuf::Any) -> TransportSocket {
    use mesh_proto::envoy::pb::envoy::config::core::v3::transport_socket::ConfigType;
    TransportSocket {
        name: "envoy.transport_sockets.tls".to_string(),
        config_type: Some(ConfigType::TypedConfig(config)),
    }
}
