//! clsact qdiscs and the capture's direct-action `bpf` filters. Adding clsact, attaching and
//! detaching programs go through aya's tc API (`Programs::add_clsact`, `attach`, `detach`);
//! listing filters and deleting the qdisc, which aya does not offer, are rtnetlink dumps and
//! requests with `netlink-packet-route`'s tc messages, here.

use mesh_capture::rtnl::{Rtnl, RtnlError};
use netlink_packet_route::tc::{
    TcAttribute, TcFilterBpfOption, TcHandle, TcHeader, TcMessage, TcOption,
};
use netlink_packet_route::RouteNetlinkMessage;
use nix::errno::Errno;

/// The handle of our filters (`tc filter ... handle 1`).
#[cfg(feature = "bpf")]
pub(crate) const FILTER_HANDLE: u16 = 1;

/// Which clsact hook.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hook {
    Ingress,
    Egress,
}

impl Hook {
    /// `TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_INGRESS / TC_H_MIN_EGRESS)`.
    fn parent(self) -> TcHandle {
        let minor = match self {
            Hook::Ingress => TcHandle::MIN_INGRESS,
            Hook::Egress => TcHandle::MIN_EGRESS,
        };
        TcHandle {
            major: TcHandle::CLSACT.major,
            minor,
        }
    }

    #[cfg(feature = "bpf")]
    pub(crate) fn attach_type(self) -> aya::programs::TcAttachType {
        match self {
            Hook::Ingress => aya::programs::TcAttachType::Ingress,
            Hook::Egress => aya::programs::TcAttachType::Egress,
        }
    }
}

/// A filter found on a hook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Filter {
    pub priority: u16,
    pub handle: u32,
    pub kind: String,
    /// The name of a `bpf` filter (aya names it after the program).
    pub name: Option<String>,
}

/// The errno inside an aya tc error, if the kernel answered with one.
#[cfg(feature = "bpf")]
pub(crate) fn tc_errno(error: &aya::programs::tc::TcError) -> Option<Errno> {
    use aya::programs::tc::TcError;
    match error {
        TcError::NetlinkError(error) => error.raw_os_error().map(Errno::from_raw),
        TcError::IoError(error) => error.raw_os_error().map(Errno::from_raw),
        _ => None,
    }
}

/// The clsact qdisc of `ifindex` (`tc qdisc del dev X clsact`).
fn clsact(ifindex: u32) -> TcMessage {
    let mut message = TcMessage::with_index(ifindex as i32);
    message.header.handle = TcHandle {
        major: TcHandle::CLSACT.major,
        minor: 0,
    };
    message.header.parent = TcHandle::CLSACT;
    message.attributes = vec![TcAttribute::Kind("clsact".to_owned())];
    message
}

/// Removes the clsact qdisc of `ifindex` (and every filter on it); absent is fine.
pub(crate) fn delete_clsact(nl: &mut Rtnl, ifindex: u32) -> Result<(), RtnlError> {
    match nl.request(
        "delete the clsact qdisc",
        RouteNetlinkMessage::DelQueueDiscipline(clsact(ifindex)),
        0,
    ) {
        Err(error) if is_absent(&error) => Ok(()),
        other => other,
    }
}

/// The filters on `hook` of `ifindex` (none when there is no clsact qdisc).
pub(crate) fn filters(nl: &mut Rtnl, ifindex: u32, hook: Hook) -> Result<Vec<Filter>, RtnlError> {
    let mut request = TcMessage::with_index(ifindex as i32);
    request.header.parent = hook.parent();
    let answers = match nl.dump(
        "list tc filters",
        RouteNetlinkMessage::GetTrafficFilter(request),
    ) {
        Err(error) if is_absent(&error) => return Ok(Vec::new()),
        other => other?,
    };
    let mut filters: Vec<Filter> = answers
        .entries
        .iter()
        .filter_map(|answer| match answer {
            RouteNetlinkMessage::NewTrafficFilter(message) => parse_filter(message),
            _ => None,
        })
        .collect();
    // Someone else's filter whose options netlink-packet-route cannot read: still a filter
    // (it keeps the clsact qdisc alive), just not ours.
    filters.extend(
        answers
            .unparsed
            .iter()
            .filter(|entry| entry.message_type == RTM_NEWTFILTER)
            .filter_map(|entry| TcHeader::parse(&entry.payload).ok())
            .filter_map(|header| Filter::of(&header)),
    );
    Ok(filters)
}

/// `RTM_NEWTFILTER` (include/uapi/linux/rtnetlink.h).
const RTM_NEWTFILTER: u16 = 44;

impl Filter {
    /// The filter a dump entry's header describes, without kind or name; `None` for the
    /// entry the dump lists for each priority's classifier itself (handle 0).
    fn of(header: &TcHeader) -> Option<Filter> {
        let handle = u32::from(header.handle);
        (handle != 0).then(|| Filter {
            priority: u16::try_from(header.info >> 16).unwrap_or(0),
            handle,
            kind: String::new(),
            name: None,
        })
    }
}

fn parse_filter(message: &TcMessage) -> Option<Filter> {
    let mut filter = Filter::of(&message.header)?;
    for attribute in &message.attributes {
        match attribute {
            TcAttribute::Kind(kind) => filter.kind = kind.clone(),
            TcAttribute::Options(options) => {
                filter.name = options.iter().find_map(|option| match option {
                    TcOption::Bpf(TcFilterBpfOption::ProgName(name)) => Some(name.clone()),
                    _ => None,
                });
            }
            _ => {}
        }
    }
    Some(filter)
}

/// The object (qdisc, filter) is not there: `ENOENT`, or `EINVAL` for a missing parent qdisc.
fn is_absent(error: &RtnlError) -> bool {
    matches!(error.errno(), Some(Errno::ENOENT | Errno::EINVAL))
}
