//! The JSON of `POST /cmdadd` as upstream's Go agent and plugin write it
//! (`nodeagent.CNIPluginAddEvent`): `{"Netns", "PodName", "PodNamespace", "IPs"}` where each IP
//! is a Go `IPConfig` whose `Address` is a `net.IPNet`:
//! `{"Address": {"IP": "10.1.0.5", "Mask": "////AA=="}}` (the mask is standard base64 bytes,
//! as Go's `encoding/json` writes `[]byte`). We also
//! send `PodUID`, which Go ignores. Reading, a plain `"10.1.0.5/24"` string is accepted too.

use std::net::IpAddr;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use serde::de::Error as _;
use serde::ser::SerializeSeq;
use serde::{Deserialize, Deserializer, Serializer};
use serde_json::{json, Map, Value};

use super::CniAddEvent;

/// Why a `/cmdadd` body was rejected; names the offending field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("field {field}: {why}")]
pub struct WireError {
    pub field: String,
    pub why: String,
}

fn wire_error(field: impl Into<String>, why: impl Into<String>) -> WireError {
    WireError {
        field: field.into(),
        why: why.into(),
    }
}

/// Serde `with` module for `CniAddEvent::ips` (`address/prefix` strings on our side).
pub(crate) mod ips {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(
        ips: &[String],
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(ips.len()))?;
        for (index, ip) in ips.iter().enumerate() {
            let value = ip_config(ip)
                .map_err(|why| serde::ser::Error::custom(format!("IPs[{index}] {ip:?}: {why}")))?;
            seq.serialize_element(&value)?;
        }
        seq.end()
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<String>, D::Error> {
        let value = Option::<Value>::deserialize(deserializer)?;
        decode_ips(value.as_ref()).map_err(D::Error::custom)
    }
}

/// Decodes a `/cmdadd` body, naming the field that is wrong.
pub fn decode_event(body: &[u8]) -> Result<CniAddEvent, WireError> {
    let value: Value =
        serde_json::from_slice(body).map_err(|error| wire_error("(body)", error.to_string()))?;
    let Value::Object(map) = value else {
        return Err(wire_error("(body)", "expected a JSON object"));
    };
    let netns = required_str(&map, "Netns")?;
    if netns.is_empty() {
        return Err(wire_error("Netns", "must name the pod's network namespace"));
    }
    Ok(CniAddEvent {
        netns,
        pod_name: required_str(&map, "PodName")?,
        pod_namespace: required_str(&map, "PodNamespace")?,
        pod_uid: optional_str(&map, "PodUID")?.unwrap_or_default(),
        ips: decode_ips(map.get("IPs"))?,
    })
}

fn required_str(map: &Map<String, Value>, field: &str) -> Result<String, WireError> {
    optional_str(map, field)?.ok_or_else(|| wire_error(field, "missing"))
}

fn optional_str(map: &Map<String, Value>, field: &str) -> Result<Option<String>, WireError> {
    match map.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(other) => Err(wire_error(field, format!("expected a string, got {other}"))),
    }
}

fn decode_ips(value: Option<&Value>) -> Result<Vec<String>, WireError> {
    let items = match value {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(other) => return Err(wire_error("IPs", format!("expected an array, got {other}"))),
    };
    items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            decode_ip(item).map_err(|why| wire_error(format!("IPs[{index}]"), why.to_string()))
        })
        .collect()
}

/// Why an `address/prefix` is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    #[error("{cidr:?} is not address/prefix")]
    NoPrefix { cidr: String },
    #[error("{address:?} in {cidr:?} is not an IP address")]
    Address { cidr: String, address: String },
    #[error("prefix in {cidr:?} is not 0..={max}")]
    Prefix { cidr: String, max: u8 },
}

/// Why an element of `IPs` is not a Go `IPConfig` (nor `address/prefix`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum IpConfigError {
    #[error(transparent)]
    Cidr(#[from] CidrError),
    #[error("Address: expected an object {{\"IP\", \"Mask\"}}")]
    NoAddress,
    #[error("Address.IP: expected a string")]
    NoIp,
    #[error("Address.IP: {0:?} is not an IP address")]
    BadIp(String),
    #[error("Address.Mask: expected a base64 string")]
    NoMask,
    #[error("Address.Mask: not base64")]
    MaskNotBase64,
    #[error("Address.Mask: not a contiguous netmask of the address's family")]
    BadMask,
    #[error("expected an IPConfig object or \"address/prefix\", got {0}")]
    Shape(String),
}

pub(super) fn decode_ip(item: &Value) -> Result<String, IpConfigError> {
    match item {
        Value::String(cidr) => Ok(parse_cidr(cidr).map(|_| cidr.clone())?),
        Value::Object(config) => {
            let address = config
                .get("Address")
                .and_then(Value::as_object)
                .ok_or(IpConfigError::NoAddress)?;
            let ip = address
                .get("IP")
                .and_then(Value::as_str)
                .ok_or(IpConfigError::NoIp)?;
            let ip: IpAddr = ip
                .parse()
                .map_err(|_| IpConfigError::BadIp(ip.to_owned()))?;
            let mask = address
                .get("Mask")
                .and_then(Value::as_str)
                .ok_or(IpConfigError::NoMask)?;
            let mask = BASE64
                .decode(mask)
                .map_err(|_| IpConfigError::MaskNotBase64)?;
            let prefix = mask_prefix(ip, &mask).ok_or(IpConfigError::BadMask)?;
            Ok(format!("{ip}/{prefix}"))
        }
        other => Err(IpConfigError::Shape(other.to_string())),
    }
}

/// Parses `address/prefix` (the prefix within the family's bits).
pub fn parse_cidr(cidr: &str) -> Result<(IpAddr, u8), CidrError> {
    let (address, prefix) = cidr.split_once('/').ok_or_else(|| CidrError::NoPrefix {
        cidr: cidr.to_owned(),
    })?;
    let ip: IpAddr = address.parse().map_err(|_| CidrError::Address {
        cidr: cidr.to_owned(),
        address: address.to_owned(),
    })?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let prefix: u8 = prefix
        .parse()
        .ok()
        .filter(|prefix| *prefix <= max)
        .ok_or_else(|| CidrError::Prefix {
            cidr: cidr.to_owned(),
            max,
        })?;
    Ok((ip, prefix))
}

/// The Go `IPConfig` of `address/prefix`.
pub(super) fn ip_config(cidr: &str) -> Result<Value, CidrError> {
    let (ip, prefix) = parse_cidr(cidr)?;
    let bytes = if ip.is_ipv4() { 4 } else { 16 };
    let mask: Vec<u8> = (0..bytes)
        .map(|index| {
            let ones = u32::from(prefix).saturating_sub(index * 8).min(8);
            // `ones` is 0..=8, so the shifted value fits in a byte.
            (0xff00u16 >> ones) as u8
        })
        .collect();
    Ok(json!({"Address": {"IP": ip.to_string(), "Mask": BASE64.encode(&mask)}}))
}

/// The prefix length of a contiguous netmask (Go uses 16-byte masks for IPv4 sometimes).
fn mask_prefix(ip: IpAddr, mask: &[u8]) -> Option<u8> {
    let ones: u32 = mask.iter().map(|byte| byte.count_ones()).sum();
    let contiguous = mask
        .iter()
        .flat_map(|byte| (0..8).rev().map(move |bit| byte >> bit & 1 == 1))
        .skip_while(|bit| *bit)
        .all(|bit| !bit);
    let ones = match (ip.is_ipv4(), mask.len()) {
        (true, 4) | (false, 16) => ones,
        (true, 16) if ones >= 96 => ones - 96,
        _ => return None,
    };
    contiguous.then(|| u8::try_from(ones).ok()).flatten()
}
