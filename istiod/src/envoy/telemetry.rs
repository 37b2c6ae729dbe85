//! What a waypoint's and a sidecar's HTTP chains log: every request to pilot-agent's access log
//! service (which turns them into Istio's request metrics, since plain Envoy has no
//! `istio.stats`), with the source identity from filter state (or the client certificate) and
//! the destination workload from the endpoint's metadata; and, when configured, one line per
//! request in Istio's default text format.

use std::time::Duration;

use mesh_proto::envoy::pb::envoy::config::accesslog::v3::{access_log, AccessLog};
use mesh_proto::envoy::pb::envoy::config::core::v3::{
    data_source, grpc_service, substitution_format_string, ApiVersion, DataSource, GrpcService,
    SubstitutionFormatString,
};
use mesh_proto::envoy::pb::envoy::extensions::access_loggers::file::v3::{
    file_access_log, FileAccessLog,
};
use mesh_proto::envoy::pb::envoy::extensions::access_loggers::grpc::v3::{
    CommonGrpcAccessLogConfig, HttpGrpcAccessLogConfig,
};
use mesh_proto::envoy::pb::envoy::r#type::metadata::v3::{
    metadata_key, metadata_kind, MetadataKey, MetadataKind,
};
use mesh_proto::envoy::pb::envoy::r#type::tracing::v3::{custom_tag, CustomTag};

use super::any::{duration, pack};
use super::names;

/// Istio's default access log line (mesh config `accessLogFormat` unset, text encoding).
pub const ISTIO_TEXT_FORMAT: &str = "[%START_TIME%] \"%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%\" %RESPONSE_CODE% %RESPONSE_FLAGS% %RESPONSE_CODE_DETAILS% %CONNECTION_TERMINATION_DETAILS% \"%UPSTREAM_TRANSPORT_FAILURE_REASON%\" %BYTES_RECEIVED% %BYTES_SENT% %DURATION% %RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% \"%REQ(X-FORWARDED-FOR)%\" \"%REQ(USER-AGENT)%\" \"%REQ(X-REQUEST-ID)%\" \"%REQ(:AUTHORITY)%\" \"%UPSTREAM_HOST%\" %UPSTREAM_CLUSTER_RAW% %UPSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_REMOTE_ADDRESS% %REQUESTED_SERVER_NAME% %ROUTE_NAME%\n";

/// How often Envoy flushes buffered entries to the agent.
const FLUSH_INTERVAL: Duration = Duration::from_millis(200);

/// The access logs of a waypoint HTTP chain for `service` (its hostname).
pub fn http_access_logs(access_log_file: &str, service: &str) -> Vec<AccessLog> {
    access_logs(
        access_log_file,
        vec![literal(names::TAG_DESTINATION_SERVICE, service)],
    )
}

/// The access logs of a sidecar's HTTP chain: `reporter` is `source` (outbound) or
/// `destination` (inbound, where `service` is the service the port belongs to); `security` is
/// Istio's `connection_security_policy` of the chain. The agent fills in its own side.
pub fn sidecar_access_logs(
    access_log_file: &str,
    reporter: &str,
    security: &str,
    service: Option<&str>,
) -> Vec<AccessLog> {
    let mut tags = vec![
        literal(names::TAG_REPORTER, reporter),
        literal(names::TAG_SECURITY_POLICY, security),
    ];
    tags.extend(service.map(|s| literal(names::TAG_DESTINATION_SERVICE, s)));
    access_logs(access_log_file, tags)
}

fn access_logs(access_log_file: &str, tags: Vec<CustomTag>) -> Vec<AccessLog> {
    let mut logs = vec![AccessLog {
        name: "envoy.access_loggers.http_grpc".into(),
        config_type: Some(access_log::ConfigType::TypedConfig(pack(
            &HttpGrpcAccessLogConfig {
                common_config: Some(common_grpc(tags)),
                additional_request_headers_to_log: vec!["content-type".into()],
                additional_response_headers_to_log: vec!["grpc-status".into()],
                additional_response_trailers_to_log: vec!["grpc-status".into()],
            },
        ))),
        ..AccessLog::default()
    }];
    if !access_log_file.is_empty() {
        logs.push(file_log(access_log_file));
    }
    logs
}

fn literal(tag: &str, value: &str) -> CustomTag {
    CustomTag {
        tag: tag.into(),
        r#type: Some(custom_tag::Type::Literal(custom_tag::Literal {
            value: value.into(),
        })),
    }
}

/// To the agent's access log service, with `tags` and the upstream endpoint's workload and
/// principal.
fn common_grpc(mut tags: Vec<CustomTag>) -> CommonGrpcAccessLogConfig {
    tags.push(host_metadata_tag(
        names::TAG_DESTINATION_WORKLOAD,
        names::WORKLOAD_METADATA_KEY,
    ));
    tags.push(host_metadata_tag(
        names::TAG_DESTINATION_PRINCIPAL,
        names::PRINCIPAL_METADATA_KEY,
    ));
    CommonGrpcAccessLogConfig {
        log_name: names::TELEMETRY_LOG_NAME.into(),
        grpc_service: Some(GrpcService {
            target_specifier: Some(grpc_service::TargetSpecifier::EnvoyGrpc(
                grpc_service::EnvoyGrpc {
                    cluster_name: names::TELEMETRY_CLUSTER.into(),
                    ..grpc_service::EnvoyGrpc::default()
                },
            )),
            ..GrpcService::default()
        }),
        transport_api_version: ApiVersion::V3 as i32,
        buffer_flush_interval: Some(duration(FLUSH_INTERVAL)),
        filter_state_objects_to_log: vec![names::FS_PEER_PRINCIPAL.into()],
        custom_tags: tags,
        ..CommonGrpcAccessLogConfig::default()
    }
}

/// A tag holding `istio.<key>` of the upstream endpoint's metadata.
fn host_metadata_tag(tag: &str, key: &str) -> CustomTag {
    CustomTag {
        tag: tag.into(),
        r#type: Some(custom_tag::Type::Metadata(custom_tag::Metadata {
            kind: Some(MetadataKind {
                kind: Some(metadata_kind::Kind::Host(metadata_kind::Host {})),
            }),
            metadata_key: Some(MetadataKey {
                key: names::ISTIO_METADATA.into(),
                path: vec![metadata_key::PathSegment {
                    segment: Some(metadata_key::path_segment::Segment::Key(key.into())),
                }],
            }),
            default_value: String::new(),
        })),
    }
}

fn file_log(path: &str) -> AccessLog {
    let format = SubstitutionFormatString {
        format: Some(substitution_format_string::Format::TextFormatSource(
            DataSource {
                specifier: Some(data_source::Specifier::InlineString(
                    ISTIO_TEXT_FORMAT.into(),
                )),
                ..DataSource::default()
            },
        )),
        ..SubstitutionFormatString::default()
    };
    AccessLog {
        name: "envoy.access_loggers.file".into(),
        config_type: Some(access_log::ConfigType::TypedConfig(pack(&FileAccessLog {
            path: path.into(),
            access_log_format: Some(file_access_log::AccessLogFormat::LogFormat(format)),
        }))),
        ..AccessLog::default()
    }
}
