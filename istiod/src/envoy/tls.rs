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

fn uri_san(pattern: string_matcher::MatchPattern) -> SubjectAltNameMatcher {
    SubjectAltNameMatcher {
        san_type: SanType::Uri as i32,
        matcher: Some(StringMatcher {
            match_pattern: Some(pattern),
            ..StringMatcher::default()
        }),
        ..SubjectAltNameMatcher::default()
    }
}

/// Any SPIFFE identity of the trust domain.
fn trust_domain_san(trust_domain: &str) -> SubjectAltNameMatcher {
    uri_san(string_matcher::MatchPattern::Prefix(format!(
        "spiffe://{trust_domain}/"
    )))
}

/// TLS 1.3, ALPN h2, our certificate, peers verified against the roots and the trust domain.
fn common(trust_domain: &str) -> CommonTlsContext {
    common_with(
        vec![trust_domain_san(trust_domain)],
        vec!["h2".to_string()],
        TlsProtocol::TlSv13,
    )
}

/// Our certificate (`default`), peers verified against the roots (`ROOTCA`) and `sans`.
fn common_with(
    sans: Vec<SubjectAltNameMatcher>,
    alpn_protocols: Vec<String>,
    minimum: TlsProtocol,
) -> CommonTlsContext {
    CommonTlsContext {
        tls_params: Some(TlsParameters {
            tls_minimum_protocol_version: minimum as i32,
            tls_maximum_protocol_version: TlsProtocol::TlSv13 as i32,
            ..TlsParameters::default()
        }),
        alpn_protocols,
        tls_certificate_sds_secret_configs: vec![sds(names::SECRET_DEFAULT)],
        validation_context_type: Some(ValidationContextType::CombinedValidationContext(
            CombinedCertificateValidationContext {
                default_validation_context: Some(CertificateValidationContext {
                    match_typed_subject_alt_names: sans,
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

/// ALPN a sidecar offers when it calls another sidecar, and what marks Istio mutual TLS on
/// the inbound side (Istio's sidecars also offer `istio-peer-exchange` and `istio-http/*`
/// through their own ALPN filter, which a standard Envoy does not have).
pub const ISTIO_ALPN: &[&str] = &["istio-peer-exchange", "istio"];

/// The ALPN values that mark a connection as Istio mutual TLS at a sidecar's inbound listener.
pub const ISTIO_INBOUND_ALPN: &[&str] = &[
    "istio",
    "istio-peer-exchange",
    "istio-http/1.0",
    "istio-http/1.1",
    "istio-h2",
];

/// A sidecar calling a workload with a sidecar: TLS 1.2 or 1.3 with the proxy's certificate, the
/// peer verified against the roots and, exactly, `sans` (any identity of the trust domain when
/// empty), SNI `sni`, ALPN `istio`.
pub fn istio_mutual_client(trust_domain: &str, sni: &str, sans: &[&str]) -> TransportSocket {
    let sans = if sans.is_empty() {
        vec![trust_domain_san(trust_domain)]
    } else {
        (sans.iter())
            .map(|s| uri_san(string_matcher::MatchPattern::Exact(s.to_string())))
            .collect()
    };
    let alpn = ISTIO_ALPN.iter().map(|s| s.to_string()).collect();
    let ctx = UpstreamTlsContext {
        common_tls_context: Some(common_with(sans, alpn, TlsProtocol::TlSv12)),
        sni: sni.to_string(),
        ..UpstreamTlsContext::default()
    };
    transport_socket(pack(&ctx))
}

/// A sidecar's inbound side of Istio mutual TLS: a client certificate of the trust domain is
/// required; `alpn` is what the chain negotiates (`h2`, `http/1.1` for HTTP chains).
pub fn istio_mutual_server(trust_domain: &str, alpn: &[&str]) -> TransportSocket {
    let alpn = alpn.iter().map(|s| s.to_string()).collect();
    let ctx = DownstreamTlsContext {
        common_tls_context: Some(common_with(
            vec![trust_domain_san(trust_domain)],
            alpn,
            TlsProtocol::TlSv12,
        )),
        require_client_certificate: Some(bool_value(true)),
        ..DownstreamTlsContext::default()
    };
    transport_socket(pack(&ctx))
}

/// Where a proxy finds the roots to verify a server when a DestinationRule names none (the
/// system bundle of Debian-based images, Istio's proxy image among them).
pub const SYSTEM_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// TLS a sidecar originates to a destination (DestinationRule `SIMPLE` / `MUTUAL`), all files
/// read by Envoy from the proxy's filesystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origination {
    pub sni: String,
    /// Roots to verify the server with; `None`: no verification (`insecureSkipVerify`).
    pub ca_file: Option<String>,
    pub crl_file: Option<String>,
    /// Names the server's certificate must carry (DNS, or URI when it has a scheme).
    pub sans: Vec<String>,
    /// `MUTUAL`: the client certificate chain and key.
    pub client_cert: Option<(String, String)>,
}

/// The transport socket of [`Origination`].
pub fn origination_client(o: &Origination) -> TransportSocket {
    use mesh_proto::envoy::pb::envoy::config::core::v3::{data_source, DataSource};
    use mesh_proto::envoy::pb::envoy::extensions::transport_sockets::tls::v3::TlsCertificate;
    let file = |path: &str| DataSource {
        specifier: Some(data_source::Specifier::Filename(path.to_string())),
        ..DataSource::default()
    };
    let validation = o.ca_file.as_deref().map(|ca| {
        ValidationContextType::ValidationContext(CertificateValidationContext {
            trusted_ca: Some(file(ca)),
            crl: o.crl_file.as_deref().map(file),
            match_typed_subject_alt_names: (o.sans.iter())
                .map(|s| {
                    let exact = string_matcher::MatchPattern::Exact(s.clone());
                    if s.contains("://") {
                        uri_san(exact)
                    } else {
                        SubjectAltNameMatcher {
                            san_type: SanType::Dns as i32,
                            ..uri_san(exact)
                        }
                    }
                })
                .collect(),
            ..CertificateValidationContext::default()
        })
    });
    let ctx = UpstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            tls_certificates: (o.client_cert.iter())
                .map(|(chain, key)| TlsCertificate {
                    certificate_chain: Some(file(chain)),
                    private_key: Some(file(key)),
                    ..TlsCertificate::default()
                })
                .collect(),
            validation_context_type: validation,
            ..CommonTlsContext::default()
        }),
        sni: o.sni.clone(),
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

/// The SDS name of a gateway credential (`credentialName`), served by istiod over ADS.
pub fn credential_resource(name: &str) -> String {
    format!("kubernetes://{name}")
}

/// The SDS name of a gateway credential's client CA (`MUTUAL`).
pub fn credential_ca_resource(name: &str) -> String {
    format!("kubernetes://{name}-cacert")
}

/// An SDS secret istiod serves itself, over the proxy's ADS stream.
fn ads_sds(name: String) -> SdsSecretConfig {
    SdsSecretConfig {
        name,
        sds_config: Some(super::any::ads_source()),
    }
}

/// A gateway server's TLS termination with `credentialName`: the certificate by SDS over ADS,
/// and for `MUTUAL` a client certificate required and checked against the credential's CA.
pub fn gateway_server(credential: &str, mutual: bool) -> TransportSocket {
    let ctx = DownstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            tls_certificate_sds_secret_configs: vec![ads_sds(credential_resource(credential))],
            validation_context_type: mutual.then(|| {
                ValidationContextType::ValidationContextSdsSecretConfig(ads_sds(
                    credential_ca_resource(credential),
                ))
            }),
            alpn_protocols: vec!["h2".into(), "http/1.1".into()],
            ..CommonTlsContext::default()
        }),
        require_client_certificate: mutual.then(|| bool_value(true)),
        ..DownstreamTlsContext::default()
    };
    transport_socket(pack(&ctx))
}

/// The Envoy secrets of a gateway credential: its certificate chain and key, and (when it
/// has one) its CA.
pub fn credential_secrets(
    name: &str,
    cert_chain: &[u8],
    key: &[u8],
    ca: Option<&[u8]>,
) -> Vec<mesh_proto::envoy::pb::envoy::extensions::transport_sockets::tls::v3::Secret> {
    use mesh_proto::envoy::pb::envoy::config::core::v3::{data_source, DataSource};
    use mesh_proto::envoy::pb::envoy::extensions::transport_sockets::tls::v3::{
        secret, Secret, TlsCertificate,
    };
    let inline = |b: &[u8]| DataSource {
        specifier: Some(data_source::Specifier::InlineBytes(b.to_vec())),
        ..DataSource::default()
    };
    let mut out = vec![Secret {
        name: credential_resource(name),
        r#type: Some(secret::Type::TlsCertificate(TlsCertificate {
            certificate_chain: Some(inline(cert_chain)),
            private_key: Some(inline(key)),
            ..TlsCertificate::default()
        })),
    }];
    if let Some(ca) = ca {
        out.push(Secret {
            name: credential_ca_resource(name),
            r#type: Some(secret::Type::ValidationContext(
                CertificateValidationContext {
                    trusted_ca: Some(inline(ca)),
                    ..CertificateValidationContext::default()
                },
            )),
        });
    }
    out
}
