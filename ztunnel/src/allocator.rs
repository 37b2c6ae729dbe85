//! glibc malloc tuning for a proxy, applied once at the start of `main` (before any thread).
//!
//! - At most [`ARENA_MAX`] arenas: glibc gives each thread that allocates its own arena (up to
//!   8 × cores), and every arena keeps its own free memory; ztunnel's threads (control, data
//!   plane workers, blocking pool, one per pod netns) do not contend enough to need more.
//! - Fixed mmap and trim thresholds. By default glibc raises them as it sees large frees, and
//!   then hands the top of an arena back to the kernel (`MADV_DONTNEED`) whenever more than
//!   twice the largest recent allocation is free there. Bulk HBONE traffic allocates and frees
//!   buffers of 256 KiB to 1 MiB (copy buffers, h2 frames) all the time, so that memory was
//!   returned and faulted in again on every cycle: page faults were ~15% of ztunnel's CPU
//!   during a single-stream transfer. With [`TRIM_THRESHOLD`], up to that much free memory
//!   stays in an arena; allocations below [`MMAP_THRESHOLD`] never get their own mapping.
//!
//! An operator's `MALLOC_ARENA_MAX`, `MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_` or a
//! `glibc.malloc.*` tunable in `GLIBC_TUNABLES` wins: that setting is left alone.

/// Most malloc arenas.
pub const ARENA_MAX: i32 = 2;
/// Allocations at least this big get their own mapping (returned to the kernel on free).
pub const MMAP_THRESHOLD: i32 = 4 * 1024 * 1024;
/// Free memory at the top of an arena beyond this is returned to the kernel.
pub const TRIM_THRESHOLD: i32 = 8 * 1024 * 1024;

/// One malloc parameter to set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Param {
    ArenaMax,
    MmapThreshold,
    TrimThreshold,
}

impl Param {
    /// The environment variable glibc reads for this parameter.
    fn env_var(self) -> &'static str {
        match self {
            Param::ArenaMax => "MALLOC_ARENA_MAX",
            Param::MmapThreshold => "MALLOC_MMAP_THRESHOLD_",
            Param::TrimThreshold => "MALLOC_TRIM_THRESHOLD_",
        }
    }

    /// The `GLIBC_TUNABLES` name of this parameter.
    fn tunable(self) -> &'static str {
        match self {
            Param::ArenaMax => "glibc.malloc.arena_max",
            Param::MmapThreshold => "glibc.malloc.mmap_threshold",
            Param::TrimThreshold => "glibc.malloc.trim_threshold",
        }
    }
}

/// The parameters to set and their values, leaving out those the environment (`env` looks a
/// variable up) already sets.
pub fn settings(env: impl Fn(&str) -> Option<String>) -> Vec<(Param, i32)> {
    let tunables = env("GLIBC_TUNABLES").unwrap_or_default();
    [
        (Param::ArenaMax, ARENA_MAX),
        (Param::MmapThreshold, MMAP_THRESHOLD),
        (Param::TrimThreshold, TRIM_THRESHOLD),
    ]
    .into_iter()
    .filter(|(param, _)| {
        env(param.env_var()).is_none()
            && !tunables
                .split(':')
                .any(|t| t.split('=').next() == Some(param.tunable()))
    })
    .collect()
}

/// Applies [`settings`] from the process environment; returns those glibc refused (to log
/// once logging is up). Call first thing in `main`.
pub fn tune() -> Vec<(Param, i32)> {
    settings(|name| std::env::var(name).ok())
        .into_iter()
        .filter(|&(param, value)| !set(param, value))
        .collect()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[expect(
    unsafe_code,
    reason = "mallopt is glibc's only interface to these allocator parameters"
)]
fn set(param: Param, value: i32) -> bool {
    let code = match param {
        Param::ArenaMax => libc::M_ARENA_MAX,
        Param::MmapThreshold => libc::M_MMAP_THRESHOLD,
        Param::TrimThreshold => libc::M_TRIM_THRESHOLD,
    };
    // SAFETY: mallopt takes two integers and changes allocator parameters under the
    // allocator's own lock; every value here is one glibc documents as valid for its parameter.
    unsafe { libc::mallopt(code, value) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set(_param: Param, _value: i32) -> bool {
    true
}

#[cfg(test)]
mod tests;
