//! [`TestNet`]: an underlay bridge, nodes, pods, and their teardown.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};

use super::stale::{self, Owner, StateFile};
use super::{cmd, Netns, NetnsError, NETNS_DIR, STATE_DIR};

/// The node network: node IPs must be inside it (`172.30.0.0/24`).
pub const UNDERLAY_CIDR: (Ipv4Addr, u8) = (Ipv4Addr::new(172, 30, 0, 0), 24);

const MAX_NODES: usize = 254;
/// Pod interface names are `<prefix>p<i>` / `<prefix>e<i>`: four digits keep them in 15 bytes.
const MAX_PODS: usize = 9999;
const MAX_NAME_LEN: usize = 32;
const UNDERLAY: &str = "underlay";

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A node: a namespace on the underlay bridge that routes for its pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    name: String,
    netns: Netns,
    ip: Ipv4Addr,
    index: u8,
    uplink: String,
}

impl Node {
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn netns(&self) -> &Netns {
        &self.netns
    }
    /// The node IP on the underlay.
    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }
    /// 1-based position in `add_node` order: the second octet of its pod CIDR.
    pub fn index(&self) -> u8 {
        self.index
    }
    /// `10.<index>.0.0/24`.
    pub fn pod_cidr(&self) -> (Ipv4Addr, u8) {
        (Ipv4Addr::new(10, self.index, 0, 0), 24)
    }
    /// `10.<index>.0.1`: the pods' default gateway (on the node end of each pod veth).
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, self.index, 0, 1)
    }
    /// `10.<index>.0.<host>`: a pod IP in this node's CIDR (use `host` 2..=254).
    pub fn pod_ip(&self, host: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, self.index, 0, host)
    }
    /// The node's interface on the underlay (holds the node IP).
    pub fn uplink(&self) -> &str {
        &self.uplink
    }
    fn owns(&self, ip: Ipv4Addr) -> bool {
        in_cidr(ip, self.pod_cidr())
    }
}

/// A pod: a namespace with one veth to its node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pod {
    name: String,
    netns: Netns,
    ip: Ipv4Addr,
    node: String,
    iface: String,
    node_iface: String,
}

impl Pod {
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn netns(&self) -> &Netns {
        &self.netns
    }
    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }
    /// `pod_ip:port`.
    pub fn addr(&self, port: u16) -> SocketAddr {
        SocketAddr::from((self.ip, port))
    }
    /// The name of the node it runs on.
    pub fn node(&self) -> &str {
        &self.node
    }
    /// The pod's interface (holds the pod IP).
    pub fn iface(&self) -> &str {
        &self.iface
    }
    /// The node end of the pod's veth.
    pub fn node_iface(&self) -> &str {
        &self.node_iface
    }
}

impl AsRef<Netns> for Netns {
    fn as_ref(&self) -> &Netns {
        self
    }
}
impl AsRef<Netns> for Node {
    fn as_ref(&self) -> &Netns {
        &self.netns
    }
}
impl AsRef<Netns> for Pod {
    fn as_ref(&self) -> &Netns {
        &self.netns
    }
}

/// A topology of namespaces owned by this process and removed on drop (see the module docs).
#[derive(Debug)]
pub struct TestNet {
    prefix: String,
    state: StateFile,
    created: Vec<Netns>,
    underlay: Option<Netns>,
    nodes: Vec<Node>,
    pods: Vec<Pod>,
}

impl TestNet {
    /// Claims a fresh prefix (from up to 3 letters of `prefix_hint`, e.g. `"mt"`) and creates
    /// the underlay namespace with its bridge. Stale topologies of dead processes are removed
    /// first.
    pub fn new(prefix_hint: &str) -> Result<TestNet, NetnsError> {
        if let Err(error) = TestNet::cleanup_stale() {
            tracing::warn!(%error, "cannot remove stale test topologies");
        }
        let owner = Owner::current().ok_or_else(|| NetnsError::State {
            path: "/proc/self/stat".into(),
            source: std::io::Error::other("no start time for this process"),
        })?;
        let (prefix, state) = claim_prefix(prefix_hint, owner)?;
        let mut net = TestNet {
            prefix,
            state,
            created: Vec::new(),
            underlay: None,
            nodes: Vec::new(),
            pods: Vec::new(),
        };
        // From here on an error drops `net`, which removes what was created.
        let underlay = net.create_netns(UNDERLAY)?;
        let bridge = net.bridge();
        cmd::ip_batch(
            Some(underlay.name()),
            &[
                "link set lo up".to_owned(),
                format!("link add {bridge} type bridge"),
                format!("link set {bridge} up"),
            ],
        )?;
        net.underlay = Some(underlay);
        Ok(net)
    }

    /// Removes the topologies of earlier runs whose owner process is gone (killed tests):
    /// processes in their namespaces, the namespaces, their state files. Returns their
    /// prefixes. Topologies of live processes are never touched.
    pub fn cleanup_stale() -> Result<Vec<String>, NetnsError> {
        stale::cleanup_stale_in(Path::new(STATE_DIR))
    }

    /// The prefix of every namespace (`<prefix>-<name>`) and interface of this topology.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The namespace holding the underlay bridge.
    pub fn underlay(&self) -> Option<&Netns> {
        self.underlay.as_ref()
    }

    /// The underlay bridge's name.
    pub fn bridge(&self) -> String {
        format!("{}br", self.prefix)
    }

    /// Every namespace created so far, in creation order.
    pub fn namespaces(&self) -> &[Netns] {
        &self.created
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    pub fn pods(&self) -> &[Pod] {
        &self.pods
    }

    pub fn node(&self, name: &str) -> Option<&Node> {
        self.nodes.iter().find(|node| node.name == name)
    }

    pub fn pod(&self, name: &str) -> Option<&Pod> {
        self.pods.iter().find(|pod| pod.name == name)
    }

    /// Adds node `name` (netns `<prefix>-<name>`) with `node_ip` (inside [`UNDERLAY_CIDR`]) on
    /// the underlay bridge; it gets pod CIDR `10.<k>.0.0/24` (k = 1-based node number) and
    /// routes to every other node's pods.
    pub fn add_node(&mut self, name: &str, node_ip: Ipv4Addr) -> Result<Node, NetnsError> {
        self.check_name(name)?;
        check_node_ip(node_ip)?;
        if self.nodes.iter().any(|node| node.ip == node_ip) {
            return Err(invalid(node_ip, "another node has it"));
        }
        let index = u8::try_from(self.nodes.len() + 1)
            .ok()
            .filter(|&index| usize::from(index) <= MAX_NODES)
            .ok_or(NetnsError::TooMany {
                what: "nodes",
                max: MAX_NODES,
            })?;
        let underlay = self
            .underlay
            .clone()
            .ok_or(NetnsError::UnknownNode(UNDERLAY.into()))?;
        let netns = self.create_netns(name)?;
        let node = Node {
            name: name.to_owned(),
            netns: netns.clone(),
            ip: node_ip,
            index,
            uplink: format!("{}n{index}", self.prefix),
        };
        self.wire_node(&underlay, &node)?;
        self.nodes.push(node.clone());
        Ok(node)
    }

    /// Adds pod `name` (netns `<prefix>-<name>`) on `node` with `pod_ip` (normally inside the
    /// node's pod CIDR, see [`Node::pod_ip`]): a veth to the node, `pod_ip/32` routed on the node,
    /// default route via the node's gateway address.
    pub fn add_pod(
        &mut self,
        node: &Node,
        name: &str,
        pod_ip: Ipv4Addr,
    ) -> Result<Pod, NetnsError> {
        self.check_name(name)?;
        let node = self
            .nodes
            .iter()
            .find(|known| known.name == node.name)
            .cloned()
            .ok_or_else(|| NetnsError::UnknownNode(node.name.clone()))?;
        self.check_pod_ip(&node, pod_ip)?;
        let number = self.pods.len();
        if number >= MAX_PODS {
            return Err(NetnsError::TooMany {
                what: "pods",
                max: MAX_PODS,
            });
        }
        let netns = self.create_netns(name)?;
        let pod = Pod {
            name: name.to_owned(),
            netns: netns.clone(),
            ip: pod_ip,
            node: node.name.clone(),
            iface: format!("{}e{number}", self.prefix),
            node_iface: format!("{}p{number}", self.prefix),
        };
        self.wire_pod(&node, &pod)?;
        self.pods.push(pod.clone());
        Ok(pod)
    }

    /// Forwarding, the uplink on the bridge, routes between `node` and the existing nodes.
    fn wire_node(&self, underlay: &Netns, node: &Node) -> Result<(), NetnsError> {
        let (netns, uplink, index) = (&node.netns, &node.uplink, node.index);
        let port = format!("{}u{index}", self.prefix);
        netns
            .run(enable_routing)?
            .map_err(|source| NetnsError::Sysctl {
                path: "/proc/sys/net/ipv4".into(),
                source,
            })?;
        let bridge = self.bridge();
        let netns_name = netns.name();
        cmd::ip_batch(
            Some(underlay.name()),
            &[
                format!("link add {port} type veth peer name {uplink} netns {netns_name}"),
                format!("link set {port} master {bridge} up"),
            ],
        )?;
        let mut lines = vec![
            "link set lo up".to_owned(),
            format!("link set {uplink} up"),
            format!("addr add {}/{} dev {uplink}", node.ip, UNDERLAY_CIDR.1),
        ];
        for other in &self.nodes {
            lines.extend(routes_to(other, &self.pods));
        }
        cmd::ip_batch(Some(netns_name), &lines)?;
        for other in &self.nodes {
            cmd::ip_batch(Some(other.netns.name()), &routes_to(node, &[]))?;
        }
        Ok(())
    }

    /// The veth between `node` and `pod`, addresses and routes on both ends, and /32 routes on
    /// the other nodes when the pod IP is outside its node's CIDR.
    fn wire_pod(&self, node: &Node, pod: &Pod) -> Result<(), NetnsError> {
        let (gateway, pod_ip) = (node.gateway(), pod.ip);
        let (iface, node_iface, pod_netns) = (&pod.iface, &pod.node_iface, pod.netns.name());
        cmd::ip_batch(
            Some(node.netns.name()),
            &[
                format!("link add {node_iface} type veth peer name {iface} netns {pod_netns}"),
                format!("link set {node_iface} up"),
                format!("addr add {gateway}/32 dev {node_iface}"),
                format!("route add {pod_ip}/32 dev {node_iface}"),
            ],
        )?;
        cmd::ip_batch(
            Some(pod_netns),
            &[
                "link set lo up".to_owned(),
                format!("link set {iface} up"),
                format!("addr add {pod_ip}/32 dev {iface}"),
                format!("route add {gateway}/32 dev {iface} scope link"),
                format!("route add default via {gateway} dev {iface}"),
            ],
        )?;
        if !node.owns(pod_ip) {
            for other in self.nodes.iter().filter(|other| other.name != node.name) {
                let line = format!("route add {pod_ip}/32 via {}", node.ip);
                cmd::ip_batch(Some(other.netns.name()), &[line])?;
            }
        }
        Ok(())
    }

    /// A bare namespace (only `lo`, up) owned and cleaned up like the others, for pods whose
    /// network a CNI plugin chain sets up. `name` must not clash with a node or pod.
    pub fn add_bare_netns(&mut self, name: &str) -> Result<Netns, NetnsError> {
        self.check_name(name)?;
        let netns = self.create_netns(name)?;
        cmd::ip_batch(Some(netns.name()), &["link set lo up".to_owned()])?;
        Ok(netns)
    }

    fn create_netns(&mut self, name: &str) -> Result<Netns, NetnsError> {
        let netns = Netns::from_name(format!("{}-{name}", self.prefix));
        self.state.record_netns(netns.name())?;
        self.created.push(netns.clone());
        cmd::ip(None, &["netns", "add", netns.name()])?;
        Ok(netns)
    }

    fn check_name(&self, name: &str) -> Result<(), NetnsError> {
        let reason = if name.is_empty() || name.len() > MAX_NAME_LEN {
            Some("use 1 to 32 characters")
        } else if !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            Some("use ASCII letters, digits, '-' and '_'")
        } else if name == UNDERLAY || self.node(name).is_some() || self.pod(name).is_some() {
            Some("a node or pod of this topology already has it (or it is 'underlay')")
        } else {
            None
        };
        match reason {
            Some(reason) => Err(NetnsError::InvalidName {
                name: name.to_owned(),
                reason,
            }),
            None => Ok(()),
        }
    }

    fn check_pod_ip(&self, node: &Node, ip: Ipv4Addr) -> Result<(), NetnsError> {
        if self.pods.iter().any(|pod| pod.ip == ip) {
            return Err(invalid(ip, "another pod has it"));
        }
        if in_cidr(ip, UNDERLAY_CIDR) || self.nodes.iter().any(|n| n.gateway() == ip) {
            return Err(invalid(
                ip,
                "it is a node or gateway address; use Node::pod_ip(2..=254)",
            ));
        }
        if node.owns(ip) && matches!(ip.octets()[3], 0 | 255) {
            return Err(invalid(
                ip,
                "it is the network or broadcast address of the pod CIDR",
            ));
        }
        if ip.is_loopback() || ip.is_unspecified() || ip.is_multicast() || ip.is_broadcast() {
            return Err(invalid(ip, "not a unicast address"));
        }
        Ok(())
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        let names: Vec<String> = self.created.iter().map(|n| n.name().to_owned()).collect();
        match stale::teardown(&self.prefix, &names) {
            // On failure the state file stays, so a later cleanup_stale() finishes the job.
            Ok(()) => self.state.remove(),
            Err(error) => {
                tracing::warn!(prefix = %self.prefix, %error, "cannot remove a test topology")
            }
        }
    }
}

/// Routes (as `ip -batch` lines) on another node towards `node`'s pods: its CIDR and the /32s of
/// its pods outside that CIDR.
fn routes_to(node: &Node, pods: &[Pod]) -> Vec<String> {
    let (net, len) = node.pod_cidr();
    let mut lines = vec![format!("route add {net}/{len} via {}", node.ip)];
    for pod in pods
        .iter()
        .filter(|pod| pod.node == node.name && !node.owns(pod.ip))
    {
        lines.push(format!("route add {}/32 via {}", pod.ip, node.ip));
    }
    lines
}

/// Forwarding on, reverse-path filtering off; runs inside the node's namespace.
fn enable_routing() -> std::io::Result<()> {
    std::fs::write("/proc/sys/net/ipv4/ip_forward", "1")?;
    std::fs::write("/proc/sys/net/ipv4/conf/all/rp_filter", "0")?;
    std::fs::write("/proc/sys/net/ipv4/conf/default/rp_filter", "0")
}

/// Claims `<hint><pid base36><counter base36, 2 digits>`, skipping prefixes that are taken or
/// still have namespaces.
fn claim_prefix(hint: &str, owner: Owner) -> Result<(String, StateFile), NetnsError> {
    let hint = sanitize_hint(hint);
    for _ in 0..36 * 36 {
        let counter = COUNTER.fetch_add(1, Ordering::Relaxed) % (36 * 36);
        let prefix = make_prefix(&hint, owner.pid, counter);
        if leftover_netns(&prefix) {
            continue;
        }
        if let Some(state) = StateFile::claim(Path::new(STATE_DIR), &prefix, owner)? {
            return Ok((prefix, state));
        }
    }
    Err(NetnsError::NoFreePrefix { hint })
}

pub(super) fn sanitize_hint(hint: &str) -> String {
    let hint: String = hint
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .take(3)
        .collect();
    if hint.is_empty() {
        "mt".to_owned()
    } else {
        hint
    }
}

pub(super) fn make_prefix(hint: &str, pid: u32, counter: u32) -> String {
    let counter = base36(counter % (36 * 36));
    let pad = if counter.len() < 2 { "0" } else { "" };
    format!("{hint}{}{pad}{counter}", base36(pid))
}

pub(super) fn base36(mut n: u32) -> String {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(DIGITS[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8_lossy(&out).into_owned()
}

fn leftover_netns(prefix: &str) -> bool {
    let start = format!("{prefix}-");
    std::fs::read_dir(NETNS_DIR).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|entry| entry.file_name().to_string_lossy().starts_with(&start))
    })
}

pub(super) fn in_cidr(ip: Ipv4Addr, (net, len): (Ipv4Addr, u8)) -> bool {
    let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
    u32::from(ip) & mask == u32::from(net) & mask
}

fn check_node_ip(ip: Ipv4Addr) -> Result<(), NetnsError> {
    if !in_cidr(ip, UNDERLAY_CIDR) {
        return Err(invalid(ip, "node IPs must be inside 172.30.0.0/24"));
    }
    if matches!(ip.octets()[3], 0 | 255) {
        return Err(invalid(
            ip,
            "it is the network or broadcast address of 172.30.0.0/24",
        ));
    }
    Ok(())
}

fn invalid(addr: Ipv4Addr, reason: &'static str) -> NetnsError {
    NetnsError::InvalidAddress { addr, reason }
}
