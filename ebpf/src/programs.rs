//! The compiled BPF object (`bpf/capture.bpf.c`, embedded with the `bpf` feature), its
//! programs loaded into the kernel with aya, and attaching them with aya's tc API.

use crate::tc::Hook;
use crate::CaptureError;

/// The programs of the object: pod ingress, pod egress, lo ingress. aya names a tc filter after
/// its program, so these are also the filter names `tc filter show` prints (the kernel keeps
/// the first 15 bytes as the program's own name: `mesh_capture_ou`).
pub const PROGRAM_NAMES: [&str; 3] = ["mesh_capture_in", "mesh_capture_out", "mesh_capture_lo"];

#[cfg(feature = "bpf")]
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/capture.bpf.o"));

/// The BPF object file (ELF), or `None` when built without the `bpf` feature.
pub fn object() -> Option<&'static [u8]> {
    #[cfg(feature = "bpf")]
    return Some(OBJECT);
    #[cfg(not(feature = "bpf"))]
    None
}

/// The three tc programs, verified and loaded. Filters attached from them stay in the kernel
/// after this value (and the process) is gone: enrollment outlives an agent restart.
#[derive(Debug)]
pub struct Programs {
    /// aya needs `&mut` to attach; enrollments of different pods take turns. aya's own netlink
    /// socket has no receive timeout, so a kernel that never answered would hold this lock.
    #[cfg(feature = "bpf")]
    ebpf: std::sync::Mutex<aya::Ebpf>,
}

#[cfg(feature = "bpf")]
fn load_error(
    program: &'static str,
    error: impl std::error::Error + Send + Sync + 'static,
) -> CaptureError {
    CaptureError::Load {
        program,
        source: std::io::Error::other(error),
    }
}

impl Programs {
    /// Loads (and so verifies) every program of [`object`].
    #[cfg(feature = "bpf")]
    pub fn load() -> Result<Programs, CaptureError> {
        use aya::programs::SchedClassifier;

        let mut ebpf = aya::EbpfLoader::new()
            .load(OBJECT)
            .map_err(|error| load_error("(object)", error))?;
        for name in PROGRAM_NAMES {
            let program: &mut SchedClassifier = ebpf
                .program_mut(name)
                .ok_or(CaptureError::MissingProgram(name))?
                .try_into()
                .map_err(|error| load_error(name, error))?;
            program.load().map_err(|error| load_error(name, error))?;
        }
        Ok(Programs {
            ebpf: std::sync::Mutex::new(ebpf),
        })
    }

    /// Without the `bpf` feature there is nothing to load.
    #[cfg(not(feature = "bpf"))]
    pub fn load() -> Result<Programs, CaptureError> {
        Err(CaptureError::NotBuilt)
    }

    /// The kernel's ids of the loaded programs, in [`PROGRAM_NAMES`] order (`bpftool prog show id N`).
    #[cfg(feature = "bpf")]
    pub fn kernel_ids(&self) -> Result<[u32; 3], CaptureError> {
        let mut ebpf = self.lock();
        let mut ids = [0; 3];
        for (id, name) in ids.iter_mut().zip(PROGRAM_NAMES) {
            let program = classifier(&mut ebpf, name)?;
            *id = program
                .info()
                .map_err(|error| load_error(name, error))?
                .id();
        }
        Ok(ids)
    }

    /// Attaches `program` to `interface`'s `hook` as the filter at priority 1337 handle 1, or,
    /// when that filter exists (re-enrollment, an agent restart), swaps its program in place.
    #[cfg(feature = "bpf")]
    pub(crate) fn attach(
        &self,
        program: &'static str,
        interface: &str,
        hook: Hook,
    ) -> Result<(), CaptureError> {
        use aya::programs::tc::{
            NlOptions, SchedClassifierLink, TcAttachOptions, TcError, TcHandle,
        };
        use aya::programs::ProgramError;
        use mesh_capture::TC_FILTER_PRIORITY;

        let attach_error = |source| CaptureError::Attach {
            program,
            interface: interface.to_owned(),
            source,
        };
        let handle = TcHandle::new(0, crate::tc::FILTER_HANDLE);
        let mut ebpf = self.lock();
        let classifier = classifier(&mut ebpf, program)?;
        let options = NlOptions {
            priority: TC_FILTER_PRIORITY,
            handle,
            ..NlOptions::default()
        };
        let id = match classifier.attach_with_options(
            interface,
            hook.attach_type(),
            TcAttachOptions::Netlink(options),
        ) {
            Ok(id) => id,
            Err(ProgramError::TcError(error))
                if crate::tc::tc_errno(&error) == Some(nix::errno::Errno::EEXIST) =>
            {
                let existing = SchedClassifierLink::attached(
                    interface,
                    hook.attach_type(),
                    TC_FILTER_PRIORITY,
                    handle,
                    None,
                )
                .map_err(|error| attach_error(ProgramError::TcError(TcError::IoError(error))))?;
                classifier.attach_to_link(existing).map_err(attach_error)?
            }
            Err(error) => return Err(attach_error(error)),
        };
        let link = classifier.take_link(id).map_err(attach_error)?;
        // Dropping an aya link detaches it; the filter must stay when this process exits.
        std::mem::forget(link);
        Ok(())
    }

    /// Adds the clsact qdisc to `interface` (`tc qdisc add dev X clsact`); an existing one is kept.
    #[cfg(feature = "bpf")]
    pub(crate) fn add_clsact(&self, interface: &str) -> Result<(), CaptureError> {
        match aya::programs::tc::qdisc_add_clsact(interface) {
            Ok(()) => Ok(()),
            Err(error) if crate::tc::tc_errno(&error) == Some(nix::errno::Errno::EEXIST) => Ok(()),
            Err(error) => Err(CaptureError::Tc {
                what: "add the clsact qdisc",
                interface: interface.to_owned(),
                source: error,
            }),
        }
    }

    /// Detaches every filter named `name` from `interface`'s `hook`; none (or an interface
    /// that went away meanwhile) is fine.
    #[cfg(feature = "bpf")]
    pub(crate) fn detach(
        &self,
        interface: &str,
        hook: Hook,
        name: &str,
    ) -> Result<(), CaptureError> {
        use aya::programs::tc::{qdisc_detach_program, TcError};
        use nix::errno::Errno;
        match qdisc_detach_program(interface, hook.attach_type(), name) {
            Ok(()) => Ok(()),
            Err(TcError::IoError(error)) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(error)
                if matches!(
                    crate::tc::tc_errno(&error),
                    Some(Errno::ENOENT | Errno::EINVAL | Errno::ENODEV)
                ) =>
            {
                Ok(())
            }
            Err(source) => Err(CaptureError::Tc {
                what: "detach a capture filter",
                interface: interface.to_owned(),
                source,
            }),
        }
    }

    #[cfg(not(feature = "bpf"))]
    pub(crate) fn add_clsact(&self, _interface: &str) -> Result<(), CaptureError> {
        Err(CaptureError::NotBuilt)
    }

    #[cfg(not(feature = "bpf"))]
    pub(crate) fn detach(
        &self,
        _interface: &str,
        _hook: Hook,
        _name: &str,
    ) -> Result<(), CaptureError> {
        Err(CaptureError::NotBuilt)
    }

    #[cfg(not(feature = "bpf"))]
    pub(crate) fn attach(
        &self,
        _program: &'static str,
        _interface: &str,
        _hook: Hook,
    ) -> Result<(), CaptureError> {
        Err(CaptureError::NotBuilt)
    }

    #[cfg(feature = "bpf")]
    fn lock(&self) -> std::sync::MutexGuard<'_, aya::Ebpf> {
        // A panic while attaching leaves aya's state as valid as before: keep going.
        self.ebpf
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(feature = "bpf")]
fn classifier<'a>(
    ebpf: &'a mut aya::Ebpf,
    name: &'static str,
) -> Result<&'a mut aya::programs::SchedClassifier, CaptureError> {
    ebpf.program_mut(name)
        .ok_or(CaptureError::MissingProgram(name))?
        .try_into()
        .map_err(|error| load_error(name, error))
}
