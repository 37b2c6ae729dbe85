//! A waypoint Gateway's status: `Accepted`, `Programmed` and, once its Deployment has a ready
//! pod and its Service an address, `status.addresses` (the ClusterIP and the Service hostname).
//! Addresses once reported are never removed; istiod binds traffic to a waypoint only while it
//! has them.

use mesh_api::{Deployment, Gateway, GatewayStatus, GatewayStatusAddress, ObjectKey, Service};
use mesh_api::{StatusCondition, HBONE_PROTOCOL};

use crate::render::Names;

/// The port of a waypoint's mesh (HBONE) listener.
const HBONE_PORT: u16 = mesh_capture::HBONE_PORT;

/// What the controller saw of the objects made for one Gateway.
#[derive(Debug, Default)]
pub struct Observed<'a> {
    pub deployment: Option<&'a Deployment>,
    pub service: Option<&'a Service>,
    /// Objects with the names the Gateway needs that the controller does not manage.
    pub unmanaged: Vec<ObjectKey>,
    /// Objects this Gateway needs that another Gateway (the second key) already has.
    pub contested: Vec<(ObjectKey, ObjectKey)>,
}

/// The number of ready pods of a Deployment, as its status reports.
pub fn ready_replicas(d: &Deployment) -> i32 {
    d.status
        .as_ref()
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0)
}

fn cluster_ip(s: &Service) -> Option<&str> {
    s.spec
        .as_ref()
        .and_then(|spec| spec.cluster_ip.as_deref())
        .filter(|ip| !ip.is_empty() && *ip != "None")
}

/// The status `gw` should have. `now` (RFC 3339) stamps conditions whose status changed.
pub fn gateway_status(
    gw: &Gateway,
    observed: &Observed<'_>,
    domain: &str,
    now: &str,
) -> GatewayStatus {
    let names = Names::of(gw);
    let previous = gw.status.clone().unwrap_or_default();
    let generation = gw.metadata.generation;
    let hostname = names.hostname(domain);
    let ip = observed.service.and_then(cluster_ip);
    let ready = observed.deployment.map_or(0, ready_replicas) > 0;
    let (programmed, reason, message) = if let Some((object, other)) = observed.contested.first() {
        (
            false,
            "Invalid",
            format!(
                "{object} is already made for {other}; give this Gateway another \
                 gateway.istio.io/name-override"
            ),
        )
    } else if let Some(first) = observed.unmanaged.first() {
        (
            false,
            "Invalid",
            format!(
                "{first} exists and is not managed by the waypoint controller (it lacks the \
                 label gateway.istio.io/managed); delete it or rename the Gateway"
            ),
        )
    } else if ip.is_none() {
        (
            false,
            "AddressNotAssigned",
            format!("Service {hostname} has no ClusterIP yet"),
        )
    } else if !ready {
        (
            false,
            "Pending",
            format!(
                "Deployment {}/{} has no ready pod yet",
                names.namespace, names.deployment
            ),
        )
    } else {
        let port = (gw.spec.listeners.iter())
            .find(|l| l.protocol == HBONE_PROTOCOL)
            .map_or(HBONE_PORT, |l| l.port);
        (
            true,
            "Programmed",
            format!("Resource programmed, assigned to service(s) {hostname}:{port}"),
        )
    };
    let addresses = match (programmed, ip) {
        (true, Some(ip)) => vec![address("IPAddress", ip), address("Hostname", &hostname)],
        _ => previous.addresses.clone(),
    };
    let conditions = vec![
        condition(
            &previous,
            "Accepted",
            true,
            "Accepted",
            "Resource accepted",
            generation,
            now,
        ),
        condition(
            &previous,
            "Programmed",
            programmed,
            reason,
            &message,
            generation,
            now,
        ),
    ];
    GatewayStatus {
        addresses,
        conditions,
    }
}

fn address(type_: &str, value: &str) -> GatewayStatusAddress {
    GatewayStatusAddress {
        type_: Some(type_.into()),
        value: value.into(),
    }
}

/// A condition, keeping the previous transition time while its status is unchanged.
fn condition(
    previous: &GatewayStatus,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: &str,
) -> StatusCondition {
    let status = if status { "True" } else { "False" };
    let since = (previous.conditions.iter())
        .find(|c| c.type_ == type_ && c.status == status)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.to_string());
    StatusCondition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation: generation,
        last_transition_time: Some(since),
    }
}
