//! The reconcile loop's core, as a pure-ish state machine over the objects a source reports:
//! every Gateway of class `istio-waypoint` gets its ServiceAccount, Deployment and Service
//! (applied through an [`ObjectWriter`]) and its status; objects the controller made for a
//! Gateway that is gone are deleted; objects it did not make are never touched.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::sync::Arc;

use ipnet::Ipv4Net;
use mesh_api::{Gateway, Kind, Object, ObjectKey, ObjectMeta, WAYPOINT_CLASS};
use mesh_source::{ObjectWriter, SourceEvent, WriteError};
use serde_json::Value;
use tracing::{info, warn};

use crate::render::{render, Names, RenderOptions, MANAGED_LABEL, MANAGED_VALUE};
use crate::status::{gateway_status, Observed};

/// How the controller runs.
#[derive(Debug, Clone, Default)]
pub struct ControllerOptions {
    pub render: RenderOptions,
    /// Where Service ClusterIPs come from when nothing else assigns them (a directory has no
    /// API server to allocate one); `None` leaves `clusterIP` to the API server.
    pub service_cidr: Option<Ipv4Net>,
}

/// Why one object could not be reconciled (the others still are).
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("Gateway {gateway}: {source}")]
    Write {
        gateway: ObjectKey,
        #[source]
        source: WriteError,
    },
    #[error("Gateway {gateway}: no free ClusterIP in {cidr}; widen --service-cidr")]
    NoClusterIp { gateway: ObjectKey, cidr: Ipv4Net },
    #[error("{object}: {source}")]
    Delete {
        object: ObjectKey,
        #[source]
        source: WriteError,
    },
}

/// What one reconcile pass did.
#[derive(Debug, Default)]
pub struct Report {
    pub applied: Vec<ObjectKey>,
    pub deleted: Vec<ObjectKey>,
    pub statuses: Vec<ObjectKey>,
    /// Objects left alone because something the controller does not manage holds the name.
    pub skipped: Vec<ObjectKey>,
    pub errors: Vec<ReconcileError>,
}

/// The controller: the objects it has seen and where it writes.
pub struct Controller<W> {
    writer: W,
    opts: ControllerOptions,
    objects: BTreeMap<ObjectKey, Arc<Object>>,
    /// Gateways whose status this controller wrote (cleared when they go).
    statused: BTreeSet<ObjectKey>,
}

fn is_managed(meta: &ObjectMeta) -> bool {
    (meta.labels.as_ref())
        .and_then(|l| l.get(MANAGED_LABEL))
        .map(String::as_str)
        == Some(MANAGED_VALUE)
}

fn waypoint_gateway(o: &Object) -> Option<&Gateway> {
    match o {
        Object::Gateway(g) if g.spec.gateway_class_name == WAYPOINT_CLASS => Some(g),
        _ => None,
    }
}

fn key_of(value: &Value) -> Option<ObjectKey> {
    let kind = Kind::from_type(value["apiVersion"].as_str()?, value["kind"].as_str()?)?;
    let meta = &value["metadata"];
    Some(ObjectKey::new(
        kind,
        meta["namespace"].as_str().unwrap_or_default(),
        meta["name"].as_str()?,
    ))
}

impl<W: ObjectWriter> Controller<W> {
    pub fn new(writer: W, opts: ControllerOptions) -> Self {
        Controller {
            writer,
            opts,
            objects: BTreeMap::new(),
            statused: BTreeSet::new(),
        }
    }

    /// Takes in one source event; returns whether the state changed.
    pub fn observe(&mut self, event: SourceEvent) -> bool {
        match event {
            SourceEvent::Applied(o) => {
                self.objects.insert(o.key(), o);
                true
            }
            SourceEvent::Deleted(key) => self.objects.remove(&key).is_some(),
            SourceEvent::Synced => true,
            SourceEvent::Invalid(e) => {
                warn!(reason = e.reason(), "{e}");
                false
            }
        }
    }

    /// Brings every waypoint's objects and status in line with the current state.
    pub async fn reconcile(&mut self, now: &str) -> Report {
        let mut report = Report::default();
        let gateways: Vec<Arc<Object>> = (self.objects.values())
            .filter(|o| waypoint_gateway(o).is_some())
            .cloned()
            .collect();
        // Object -> the Gateway it is made for (the first Gateway by key keeps a contested name).
        let mut wanted = BTreeMap::new();
        let mut used_ips = self.cluster_ips();
        for o in &gateways {
            let Some(gw) = waypoint_gateway(o) else {
                continue;
            };
            self.reconcile_gateway(gw, now, &mut used_ips, &mut wanted, &mut report)
                .await;
        }
        self.collect_garbage(&wanted, &mut report).await;
        self.clear_stale_status(&gateways, &mut report).await;
        report
    }

    async fn reconcile_gateway(
        &mut self,
        gw: &Gateway,
        now: &str,
        used_ips: &mut BTreeSet<Ipv4Addr>,
        wanted: &mut BTreeMap<ObjectKey, ObjectKey>,
        report: &mut Report,
    ) {
        let gw_key = ObjectKey::new(
            Kind::Gateway,
            gw.metadata.namespace.clone().unwrap_or_default(),
            gw.metadata.name.clone().unwrap_or_default(),
        );
        let mut unmanaged = Vec::new();
        let mut contested = Vec::new();
        for mut value in render(gw, &self.opts.render) {
            let Some(key) = key_of(&value) else {
                continue;
            };
            if let Some(other) = wanted.get(&key).filter(|g| **g != gw_key) {
                warn!(gateway = %gw_key, object = %key, claimed_by = %other, "two Gateways need the same object; the first keeps it");
                contested.push((key.clone(), other.clone()));
                report.skipped.push(key);
                continue;
            }
            wanted.insert(key.clone(), gw_key.clone());
            let existing = self.objects.get(&key);
            if existing.is_some_and(|o| !is_managed(o.metadata())) {
                warn!(gateway = %gw_key, object = %key, "not touching an object the controller does not manage");
                unmanaged.push(key.clone());
                report.skipped.push(key);
                continue;
            }
            if key.kind == Kind::Service {
                if let Err(e) = self.assign_cluster_ip(&gw_key, &key, &mut value, used_ips) {
                    report.errors.push(e);
                    continue;
                }
            }
            match self.writer.apply(&value).await {
                Ok(true) => report.applied.push(key),
                Ok(false) => {}
                Err(source) => report.errors.push(ReconcileError::Write {
                    gateway: gw_key.clone(),
                    source,
                }),
            }
        }
        let names = Names::of(gw);
        let get = |kind| {
            self.objects
                .get(&ObjectKey::new(kind, &names.namespace, &names.deployment))
                .filter(|o| is_managed(o.metadata()))
        };
        let observed = Observed {
            deployment: get(Kind::Deployment).and_then(|o| match &**o {
                Object::Deployment(d) => Some(&**d),
                _ => None,
            }),
            service: get(Kind::Service).and_then(|o| match &**o {
                Object::Service(s) => Some(&**s),
                _ => None,
            }),
            unmanaged,
            contested,
        };
        let status = gateway_status(gw, &observed, &self.opts.render.cluster_domain, now);
        if gw.status.as_ref() != Some(&status) || !self.statused.contains(&gw_key) {
            let value = serde_json::to_value(&status).unwrap_or(Value::Null);
            match self.writer.write_status(&gw_key, Some(&value)).await {
                Ok(()) => {
                    self.statused.insert(gw_key.clone());
                    report.statuses.push(gw_key);
                }
                Err(source) => report.errors.push(ReconcileError::Write {
                    gateway: gw_key,
                    source,
                }),
            }
        }
    }

    /// ClusterIPs of every Service seen.
    fn cluster_ips(&self) -> BTreeSet<Ipv4Addr> {
        (self.objects.values())
            .filter_map(|o| match &**o {
                Object::Service(s) => s.spec.as_ref()?.cluster_ip.as_deref()?.parse().ok(),
                _ => None,
            })
            .collect()
    }

    /// Keeps the ClusterIP a managed Service already has; otherwise takes a free one from
    /// the configured range (stable per name), or leaves it to the API server.
    fn assign_cluster_ip(
        &self,
        gw_key: &ObjectKey,
        key: &ObjectKey,
        value: &mut Value,
        used: &mut BTreeSet<Ipv4Addr>,
    ) -> Result<(), ReconcileError> {
        let current = self.objects.get(key).and_then(|o| match &**o {
            Object::Service(s) => s.spec.as_ref()?.cluster_ip.clone(),
            _ => None,
        });
        let ip = match (current, self.opts.service_cidr) {
            (Some(ip), _) if !ip.is_empty() => ip,
            (_, Some(cidr)) => {
                let ip = allocate(cidr, &format!("{}/{}", key.namespace, key.name), used)
                    .ok_or_else(|| ReconcileError::NoClusterIp {
                        gateway: gw_key.clone(),
                        cidr,
                    })?;
                used.insert(ip);
                ip.to_string()
            }
            _ => return Ok(()),
        };
        value["spec"]["clusterIP"] = Value::String(ip);
        Ok(())
    }

    /// Deletes managed objects whose Gateway is gone (or no longer needs them).
    async fn collect_garbage(
        &mut self,
        wanted: &BTreeMap<ObjectKey, ObjectKey>,
        report: &mut Report,
    ) {
        let stale: Vec<ObjectKey> = (self.objects.iter())
            .filter(|(key, o)| {
                let meta = o.metadata();
                let owned_by_gateway = (meta.owner_references.iter().flatten()).any(|r| {
                    r.kind == "Gateway" && r.api_version.starts_with("gateway.networking.k8s.io/")
                });
                matches!(
                    key.kind,
                    Kind::Deployment | Kind::Service | Kind::ServiceAccount
                ) && is_managed(meta)
                    && owned_by_gateway
                    && !wanted.contains_key(*key)
            })
            .map(|(key, _)| key.clone())
            .collect();
        for key in stale {
            match self.writer.delete(&key).await {
                Ok(()) => {
                    info!(object = %key, "deleted: its Gateway is gone");
                    report.deleted.push(key);
                }
                Err(source) => report.errors.push(ReconcileError::Delete {
                    object: key,
                    source,
                }),
            }
        }
    }

    /// Clears the status this controller wrote for Gateways that are gone or changed class.
    async fn clear_stale_status(&mut self, gateways: &[Arc<Object>], report: &mut Report) {
        let live: BTreeSet<ObjectKey> = gateways.iter().map(|g| g.key()).collect();
        let gone: Vec<ObjectKey> = self.statused.difference(&live).cloned().collect();
        for key in gone {
            match self.writer.write_status(&key, None).await {
                Ok(()) => {
                    self.statused.remove(&key);
                }
                Err(source) => report.errors.push(ReconcileError::Write {
                    gateway: key,
                    source,
                }),
            }
        }
    }
}

/// A free address of `cidr` for `name`: a stable start from the name's hash, then the next
/// free one (the network address and the first host, which Kubernetes gives the `kubernetes`
/// Service, are never used).
fn allocate(cidr: Ipv4Net, name: &str, used: &BTreeSet<Ipv4Addr>) -> Option<Ipv4Addr> {
    let base = u32::from(cidr.network());
    let size = 1u64 << (32 - u32::from(cidr.prefix_len()));
    if size < 4 {
        return None;
    }
    let usable = size - 3; // network, first host, broadcast
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    (0..usable)
        .map(|i| {
            let offset = 2 + (hash.wrapping_add(i) % usable);
            Ipv4Addr::from(base.wrapping_add(u32::try_from(offset).unwrap_or(2)))
        })
        .find(|ip| !used.contains(ip))
}

#[cfg(test)]
mod tests;
