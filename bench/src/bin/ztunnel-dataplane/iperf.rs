//! iperf3 in the pods: a server per server pod, the client run to completion with `-J`.

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use mesh_testutil::netns::ChildGuard;
use mesh_testutil::Netns;

pub const PORT: u16 = 5201;

/// `iperf3 -s` inside `netns`, killed on drop.
pub struct Server {
    _child: ChildGuard,
}

impl Server {
    /// Starts it and waits until it listens.
    pub fn start(netns: &Netns, log: &Path) -> anyhow::Result<Server> {
        let log = std::fs::File::create(log).context("creating the iperf3 server log")?;
        let mut cmd = Command::new("iperf3");
        cmd.args(["-s", "-p", &PORT.to_string()])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = netns
            .spawn(&mut cmd)
            .context("starting iperf3 -s (is iperf3 installed?)")?;
        crate::load::wait_listening(netns, PORT)?;
        Ok(Server { _child: child })
    }
}

/// One iperf3 run.
#[derive(Debug, Default, Clone, Copy)]
pub struct Throughput {
    /// Received by the server, bits per second.
    pub bits_per_second: f64,
    pub retransmits: u64,
    /// Wall time of the client process.
    pub wall: Duration,
}

impl Throughput {
    pub fn gbps(&self) -> f64 {
        self.bits_per_second / 1e9
    }
}

/// `iperf3 -c server -t secs -P streams -J` from `netns`; `scratch` holds its output.
pub fn run_client(
    netns: &Netns,
    server: Ipv4Addr,
    seconds: u64,
    streams: u32,
    scratch: &Path,
) -> anyhow::Result<Throughput> {
    let out_path = scratch.join(format!("iperf3-{}-{streams}.json", netns.name()));
    let out = std::fs::File::create(&out_path)?;
    let mut cmd = Command::new("iperf3");
    cmd.args(["-c", &server.to_string(), "-p", &PORT.to_string()])
        .args(["-t", &seconds.to_string(), "-P", &streams.to_string()])
        .args(["-i", "0", "-J"])
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(Stdio::inherit());
    let start = Instant::now();
    let mut child = netns.spawn(&mut cmd)?;
    let limit = Duration::from_secs(seconds + 30);
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if start.elapsed() > limit {
            bail!(
                "iperf3 -c {server} from {} still running after {limit:?}",
                netns.name()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let wall = start.elapsed();
    let json = std::fs::read_to_string(&out_path)?;
    let mut result = parse(&json)
        .with_context(|| format!("iperf3 -c {server} from {} ({status})", netns.name()))?;
    result.wall = wall;
    Ok(result)
}

/// The receiver's total from iperf3's JSON report.
pub fn parse(json: &str) -> anyhow::Result<Throughput> {
    let v: serde_json::Value = serde_json::from_str(json).context("iperf3 output is not JSON")?;
    if let Some(error) = v.get("error").and_then(|e| e.as_str()) {
        bail!("iperf3 failed: {error}");
    }
    let end = v.get("end").context("iperf3 JSON has no `end`")?;
    let bits_per_second = end
        .pointer("/sum_received/bits_per_second")
        .and_then(|b| b.as_f64())
        .context("iperf3 JSON has no end.sum_received.bits_per_second")?;
    let retransmits = end
        .pointer("/sum_sent/retransmits")
        .and_then(|r| r.as_u64())
        .unwrap_or(0);
    Ok(Throughput {
        bits_per_second,
        retransmits,
        wall: Duration::ZERO,
    })
}

#[cfg(test)]
mod tests;
