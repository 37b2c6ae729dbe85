//! `istioctl x xds-dump`: subscribe to istiod's WDS like a ztunnel and print what it serves.

use std::collections::BTreeMap;
use std::time::Duration;

use clap::Args;
use mesh_proto::discovery::{
    aggregated_discovery_service_client::AggregatedDiscoveryServiceClient, DeltaDiscoveryRequest,
};
use mesh_proto::envoy::pb::envoy::config::core::v3::Node;
use mesh_proto::type_url;
use tokio_stream::StreamExt;

use crate::connect::IstiodArgs;
use crate::render::{self, Dump};

#[derive(Debug, Args)]
pub struct XdsDumpArgs {
    #[command(flatten)]
    pub istiod: IstiodArgs,
    /// Node name to present in the node id (ztunnel~<ip>~<pod>.<ns>~<ns>.svc.cluster.local).
    #[arg(long, default_value = "istioctl")]
    pub node: String,
    /// After the initial state, keep printing deltas for this long (e.g. 5s).
    #[arg(long, value_parser = humantime_parse)]
    pub watch: Option<Duration>,
    /// What to print: all, workloads, services, policies.
    #[arg(long, default_value = "all")]
    pub show: String,
}

fn humantime_parse(s: &str) -> Result<Duration, String> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 5s"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" | "" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        _ => Err(format!("{s:?}: unit must be ms, s or m")),
    }
}

pub async fn run(args: XdsDumpArgs) -> anyhow::Result<()> {
    let channel = args.istiod.connect().await?;
    let mut ads =
        AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(64 << 20);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let node = Node {
        id: format!(
            "ztunnel~127.0.0.1~ztunnel-{0}.istio-system~istio-system.svc.cluster.local",
            args.node
        ),
        ..Default::default()
    };
    for t in [type_url::ADDRESS, type_url::AUTHORIZATION] {
        tx.send(DeltaDiscoveryRequest {
            node: Some(node.clone()),
            type_url: t.to_string(),
            ..Default::default()
        })?;
    }
    let mut stream = ads
        .delta_aggregated_resources(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
        .await
        .map_err(|s| anyhow::anyhow!("istiod refused the xDS stream: {}", s.message()))?
        .into_inner();
    let mut state: BTreeMap<(String, String), Vec<u8>> = BTreeMap::new();
    let mut initial_types = 0;
    let deadline = args.watch.map(|d| tokio::time::Instant::now() + d);
    loop {
        let next = match (initial_types < 2, deadline) {
            (true, _) => tokio::time::timeout(Duration::from_secs(10), stream.next())
                .await
                .ok(),
            (false, Some(d)) => tokio::time::timeout_at(d, stream.next()).await.ok(),
            (false, None) => break,
        };
        let Some(Some(resp)) = next else { break };
        let resp = resp.map_err(|s| anyhow::anyhow!("xDS stream failed: {}", s.message()))?;
        tx.send(DeltaDiscoveryRequest {
            type_url: resp.type_url.clone(),
            response_nonce: resp.nonce.clone(),
            ..Default::default()
        })?;
        if initial_types >= 2 {
            for r in &resp.resources {
                println!("delta: {} updated (version {})", r.name, r.version);
            }
            for name in &resp.removed_resources {
                println!("delta: {name} removed");
            }
        }
        for name in resp.removed_resources {
            state.remove(&(resp.type_url.clone(), name));
        }
        for r in resp.resources {
            if let Some(body) = r.resource {
                state.insert((resp.type_url.clone(), r.name), body.value);
            }
        }
        initial_types += 1;
        if initial_types == 2 {
            print_state(&state, &args.show)?;
        }
    }
    if initial_types < 2 {
        anyhow::bail!("istiod did not send the initial state within 10s");
    }
    if args.watch.is_some() {
        print_state(&state, &args.show)?;
    }
    Ok(())
}

fn print_state(state: &BTreeMap<(String, String), Vec<u8>>, show: &str) -> anyhow::Result<()> {
    let mut dump = Dump::default();
    for ((type_url, name), body) in state {
        dump.add(name, type_url, body)?;
    }
    dump.sort();
    let all = show == "all";
    if all || show == "workloads" {
        println!(
            "\nWORKLOADS ({})\n{}",
            dump.workloads.len(),
            render::workloads(&dump)
        );
    }
    if all || show == "services" {
        println!(
            "SERVICES ({})\n{}",
            dump.services.len(),
            render::services(&dump)
        );
    }
    if all || show == "policies" {
        println!(
            "POLICIES ({})\n{}",
            dump.policies.len(),
            render::policies(&dump)
        );
    }
    Ok(())
}
