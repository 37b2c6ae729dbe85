//! The CNI runner of the harness with Debian's reference plugins: pods on two nodes wired by
//! `bridge` + `host-local`, exactly as a container runtime invokes them, reach each other.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use mesh_e2e::cni::{self, ConfList, PodRef, DEBIAN_CNI_DIR};
use mesh_e2e::probe::{echo, Echo};
use mesh_testutil::netns::have_root;
use mesh_testutil::TestNet;
use serde_json::json;

fn conflist(node: u8, data_dir: &std::path::Path) -> ConfList {
    ConfList::new(json!({
        "cniVersion": "1.0.0",
        "name": format!("mesh-node{node}"),
        "plugins": [{
            "type": "bridge",
            "bridge": "cni0",
            "isGateway": true,
            "ipMasq": false,
            "ipam": {
                "type": "host-local",
                "subnet": format!("10.{node}.0.0/24"),
                "dataDir": data_dir,
                "routes": [{ "dst": "0.0.0.0/0" }]
            }
        }]
    }))
}

#[test]
fn reference_plugins_wire_pods_across_nodes() {
    if !have_root("reference_plugins_wire_pods_across_nodes") {
        return;
    }
    assert!(
        PathBuf::from(DEBIAN_CNI_DIR).join("bridge").is_file(),
        "Debian's CNI plugins are missing: apt-get install containernetworking-plugins"
    );
    let mut net = TestNet::new("cni").expect("net");
    let node1 = net
        .add_node("node1", Ipv4Addr::new(172, 30, 0, 1))
        .expect("node1");
    let node2 = net
        .add_node("node2", Ipv4Addr::new(172, 30, 0, 2))
        .expect("node2");
    let data = tempfile::tempdir().expect("ipam dir");
    let path = vec![PathBuf::from(DEBIAN_CNI_DIR)];
    let mut ips = Vec::new();
    for (i, node) in [&node1, &node2].into_iter().enumerate() {
        let pod = net.add_bare_netns(&format!("pod{i}")).expect("pod netns");
        let list = conflist(node.index(), &data.path().join(node.name()));
        let netns = pod.path();
        let pod_ref = PodRef {
            namespace: "demo",
            name: &format!("pod{i}"),
            uid: &format!("uid-{i}"),
            container_id: &format!("sandbox{i}"),
            netns: &netns,
        };
        let result =
            cni::add(node.netns(), &list, &pod_ref, &path).unwrap_or_else(|e| panic!("{e}"));
        let got = cni::result_ips(&result);
        assert_eq!(got.len(), 1, "{result}");
        let ip: Ipv4Addr = got[0].parse().expect("ip");
        assert_eq!(
            ip.octets()[..3],
            [10, node.index(), 0],
            "IP from the node's subnet"
        );
        ips.push((pod, ip));
    }
    let (pod0, _) = &ips[0];
    let (pod1, ip1) = &ips[1];
    let _server = pod1
        .echo_server(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 8080)))
        .expect("server");
    let target = SocketAddr::from((*ip1, 8080));
    let mut got = echo(pod0, target);
    for _ in 0..20 {
        if got == Echo::Ok {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        got = echo(pod0, target);
    }
    assert_eq!(got, Echo::Ok, "pod on node1 reaches the pod on node2");

    // DEL releases the address (host-local's reservation file goes away).
    let list = conflist(node2.index(), &data.path().join(node2.name()));
    let reservation = data
        .path()
        .join(node2.name())
        .join("mesh-node2")
        .join(ip1.to_string());
    assert!(reservation.is_file(), "{} reserved", reservation.display());
    let netns = pod1.path();
    let pod_ref = PodRef {
        namespace: "demo",
        name: "pod1",
        uid: "uid-1",
        container_id: "sandbox1",
        netns: &netns,
    };
    cni::del(node2.netns(), &list, &pod_ref, &path).unwrap_or_else(|e| panic!("{e}"));
    assert!(!reservation.exists(), "address released by DEL");
}
