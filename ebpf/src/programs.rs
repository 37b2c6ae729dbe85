//! The compiled BPF object (`bpf/capture.bpf.c`, embedded with the `bpf` feature) and its
//! programs loaded into the kernel with aya.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use crate::CaptureError;

/// The programs of the object, in [`crate::FILTER_NAMES`] order: pod ingress, pod egress, lo
/// ingress.
pub const PROGRAM_NAMES: [&str; 3] = ["capture_in", "capture_out", "capture_lo"];

#[cfg(feature = "bpf")]
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/capture.bpf.o"));

/// The BPF object file (ELF), or `None` when built without the `bpf` feature.
pub fn object() -> Option<&'static [u8]> {
    #[cfg(feature = "bpf")]
    return Some(OBJECT);
    #[cfg(not(feature = "bpf"))]
    None
}

/// The three tc programs, verified and loaded; they stay in the kernel while a filter or these
/// fds refer to them.
#[derive(Debug)]
pub struct Programs {
    fds: [OwnedFd; 3],
}

impl Programs {
    /// Loads (and so verifies) every program of [`object`].
    #[cfg(feature = "bpf")]
    pub fn load() -> Result<Programs, CaptureError> {
        use aya::programs::SchedClassifier;

        let load_error = |program, error: &dyn std::fmt::Display| CaptureError::Load {
            program,
            source: std::io::Error::other(error.to_string()),
        };
        let mut ebpf = aya::EbpfLoader::new()
            .load(OBJECT)
            .map_err(|error| load_error("(object)", &error))?;
        let mut fds = Vec::with_capacity(PROGRAM_NAMES.len());
        for name in PROGRAM_NAMES {
            let program = ebpf
                .program_mut(name)
                .ok_or(CaptureError::MissingProgram(name))?;
            let program: &mut SchedClassifier = program
                .try_into()
                .map_err(|error| load_error(name, &error))?;
            program.load().map_err(|error| load_error(name, &error))?;
            let fd = program.fd().map_err(|error| load_error(name, &error))?;
            let fd = fd
                .as_fd()
                .try_clone_to_owned()
                .map_err(|source| CaptureError::Load {
                    program: name,
                    source,
                })?;
            fds.push(fd);
        }
        // Dropping `ebpf` closes aya's fds; ours keep the programs loaded.
        let fds: [OwnedFd; 3] = fds
            .try_into()
            .map_err(|_| CaptureError::MissingProgram(PROGRAM_NAMES[0]))?;
        Ok(Programs { fds })
    }

    /// Without the `bpf` feature there is nothing to load.
    #[cfg(not(feature = "bpf"))]
    pub fn load() -> Result<Programs, CaptureError> {
        Err(CaptureError::NotBuilt)
    }

    /// `capture_in`: clsact ingress of pod interfaces.
    pub fn capture_in(&self) -> BorrowedFd<'_> {
        self.fds[0].as_fd()
    }

    /// `capture_out`: clsact egress of pod interfaces.
    pub fn capture_out(&self) -> BorrowedFd<'_> {
        self.fds[1].as_fd()
    }

    /// `capture_lo`: clsact ingress of `lo`.
    pub fn capture_lo(&self) -> BorrowedFd<'_> {
        self.fds[2].as_fd()
    }
}
