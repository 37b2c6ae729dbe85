//! `istioctl x csr`: ask istiod's CA for a workload certificate, as a node's ztunnel does, and
//! print what was issued.

use clap::Args;
use mesh_identity::{generate_csr, Identity};
use mesh_proto::ca::istio_certificate_service_client::IstioCertificateServiceClient;
use mesh_proto::ca::IstioCertificateRequest;
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

use crate::connect::IstiodArgs;

#[derive(Debug, Args)]
pub struct CsrArgs {
    #[command(flatten)]
    pub istiod: IstiodArgs,
    /// The workload identity to request (spiffe://<td>/ns/<ns>/sa/<sa>); sent as
    /// ImpersonatedIdentity, so the token must belong to the node the pod runs on.
    #[arg(long)]
    pub identity: String,
    /// Requested lifetime in seconds (istiod caps it).
    #[arg(long, default_value_t = 86_400)]
    pub ttl: i64,
}

pub async fn run(args: CsrArgs) -> anyhow::Result<()> {
    let identity: Identity = args
        .identity
        .parse()
        .map_err(|e| anyhow::anyhow!("--identity: {e}"))?;
    let csr = generate_csr(&identity)?;
    let metadata = prost_types::Struct {
        fields: [(
            "ImpersonatedIdentity".to_string(),
            prost_types::Value {
                kind: Some(prost_types::value::Kind::StringValue(identity.to_string())),
            },
        )]
        .into_iter()
        .collect(),
    };
    let mut ca = IstioCertificateServiceClient::new(args.istiod.connect().await?);
    let resp = ca
        .create_certificate(IstioCertificateRequest {
            csr: csr.csr_pem,
            validity_duration: args.ttl,
            metadata: Some(metadata),
        })
        .await;
    let chain = match resp {
        Ok(r) => r.into_inner().cert_chain,
        Err(status) => {
            println!("refused ({:?}): {}", status.code(), status.message());
            anyhow::bail!("istiod refused the certificate request");
        }
    };
    let leaf_pem = chain
        .first()
        .ok_or_else(|| anyhow::anyhow!("istiod returned an empty chain"))?;
    let (_, pem) = x509_parser::pem::parse_x509_pem(leaf_pem.as_bytes())
        .map_err(|e| anyhow::anyhow!("leaf is not PEM: {e}"))?;
    let (_, cert) = X509Certificate::from_der(&pem.contents)
        .map_err(|e| anyhow::anyhow!("leaf is not a certificate: {e}"))?;
    let sans: Vec<String> = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|ext| {
            ext.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    GeneralName::URI(u) => Some(u.to_string()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    println!(
        "issued: chain of {} certificates (leaf first, root last)",
        chain.len()
    );
    println!("  SAN:        {}", sans.join(", "));
    println!("  issuer:     {}", cert.issuer());
    println!("  serial:     {}", cert.raw_serial_as_string());
    println!("  not before: {}", cert.validity().not_before);
    println!("  not after:  {}", cert.validity().not_after);
    Ok(())
}
