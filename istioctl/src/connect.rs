//! Connecting to istiod the way a ztunnel does: TLS to 15012 (root from istiod's published root
//! certificate), a bearer token, or plaintext to 15010.

use std::path::PathBuf;

use clap::Args;
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

/// Where istiod is and how to authenticate.
#[derive(Debug, Clone, Args)]
pub struct IstiodArgs {
    /// istiod's xDS/CA address: https://host:15012 (TLS) or http://host:15010 (plaintext xDS).
    #[arg(long, env = "XDS_ADDRESS", default_value = "https://localhost:15012")]
    pub xds_address: String,
    /// Root certificate that signed istiod's serving certificate (istiod publishes it).
    #[arg(
        long,
        env = "ROOT_CERT",
        default_value = "/var/lib/istiod/root-cert.pem"
    )]
    pub root_cert: PathBuf,
    /// TLS server name to verify on istiod's certificate.
    #[arg(long, default_value = "istiod.istio-system.svc")]
    pub server_name: String,
    /// File holding the bearer token (as ztunnel's istio-token).
    #[arg(long, env = "ISTIO_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
}

/// Adds `authorization: Bearer <token>` to every request.
#[derive(Clone, Debug)]
pub struct Bearer(Option<MetadataValue<tonic::metadata::Ascii>>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

pub type AuthedChannel = InterceptedService<Channel, Bearer>;

impl IstiodArgs {
    /// Opens a channel with TLS (for https) and the token interceptor.
    pub async fn connect(&self) -> anyhow::Result<AuthedChannel> {
        let mut endpoint = Endpoint::from_shared(self.xds_address.clone())
            .map_err(|e| anyhow::anyhow!("--xds-address {:?}: {e}", self.xds_address))?;
        if self.xds_address.starts_with("https://") {
            let pem = std::fs::read(&self.root_cert).map_err(|e| {
                anyhow::anyhow!(
                    "cannot read root certificate {}: {e} (pass --root-cert with the file istiod publishes in its state dir)",
                    self.root_cert.display()
                )
            })?;
            endpoint = endpoint.tls_config(
                ClientTlsConfig::new()
                    .ca_certificate(Certificate::from_pem(pem))
                    .domain_name(self.server_name.clone()),
            )?;
        }
        let channel = endpoint.connect().await.map_err(|e| {
            anyhow::anyhow!("cannot connect to istiod at {}: {e}", self.xds_address)
        })?;
        let token = match &self.token_file {
            Some(p) => {
                let t = std::fs::read_to_string(p)
                    .map_err(|e| anyhow::anyhow!("cannot read token file {}: {e}", p.display()))?;
                Some(format!("Bearer {}", t.trim()).parse().map_err(|_| {
                    anyhow::anyhow!("token in {} is not printable ASCII", p.display())
                })?)
            }
            None => None,
        };
        Ok(InterceptedService::new(channel, Bearer(token)))
    }
}
