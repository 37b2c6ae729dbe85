//! YAML builders for the objects tests write most.

/// The fields of a running Pod that the mesh reads.
#[derive(Debug, Clone)]
pub struct PodSpec<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub ip: &'a str,
    pub node: &'a str,
    pub service_account: &'a str,
    pub labels: &'a [(&'a str, &'a str)],
}

fn labels_block(indent: &str, labels: &[(&str, &str)]) -> String {
    if labels.is_empty() {
        return String::new();
    }
    let mut s = format!("{indent}labels:\n");
    for (k, v) in labels {
        s.push_str(&format!("{indent}  {k}: \"{v}\"\n"));
    }
    s
}

/// A Running, Ready Pod with one container port named `http` (8080).
pub fn pod_yaml(p: &PodSpec<'_>) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {ns}\n{labels}spec:\n  nodeName: {node}\n  serviceAccountName: {sa}\n  containers:\n  - name: app\n    image: app\n    ports:\n    - name: http\n      containerPort: 8080\nstatus:\n  phase: Running\n  podIP: {ip}\n  podIPs:\n  - ip: {ip}\n  conditions:\n  - type: Ready\n    status: \"True\"\n",
        name = p.name,
        ns = p.namespace,
        labels = labels_block("  ", p.labels),
        node = p.node,
        sa = p.service_account,
        ip = p.ip,
    )
}

/// A Namespace with labels.
pub fn namespace_yaml(name: &str, labels: &[(&str, &str)]) -> String {
    format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n{}",
        labels_block("  ", labels)
    )
}

/// A ClusterIP Service selecting `app: <selector_app>`, port 80 -> target port `http`.
pub fn service_yaml(namespace: &str, name: &str, cluster_ip: &str, selector_app: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: {namespace}\nspec:\n  clusterIP: {cluster_ip}\n  selector:\n    app: {selector_app}\n  ports:\n  - name: http\n    port: 80\n    targetPort: http\n"
    )
}
