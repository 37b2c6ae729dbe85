//! What the benchmark reads about the ztunnel processes from `/proc`: CPU time, RSS, open fds.

use std::time::Duration;

use anyhow::Context;
use mesh_testutil::Netns;

/// Linux reports `utime`/`stime` in `/proc/<pid>/stat` in USER_HZ ticks, 100 per second on
/// every architecture the kernel exposes to user space (`sysconf(_SC_CLK_TCK)`).
const TICKS_PER_SECOND: f64 = 100.0;

/// The process whose main thread is in `netns` and whose `comm` is `name` (e.g. the ztunnel of
/// a node: istiod shares node1's namespace).
pub fn find_pid(netns: &Netns, name: &str) -> anyhow::Result<u32> {
    netns
        .pids()
        .into_iter()
        .filter_map(|pid| u32::try_from(pid).ok())
        .find(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == name)
        })
        .with_context(|| format!("no {name} process in netns {}", netns.name()))
}

/// User and system CPU time of `pid` so far.
pub fn cpu_split(pid: u32) -> anyhow::Result<(Duration, Duration)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat: is the process gone?"))?;
    // `comm` is in parentheses and may contain spaces: the fields start after the last ')'.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .context("malformed /proc/<pid>/stat")?;
    // After ')': state(3) ppid(4) ... utime(14) stime(15), so utime is the 12th from here.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> anyhow::Result<f64> {
        Ok(fields
            .get(i)
            .context("short /proc/<pid>/stat")?
            .parse::<u64>()? as f64)
    };
    let secs = |t: f64| Duration::from_secs_f64(t / TICKS_PER_SECOND);
    Ok((secs(ticks(11)?), secs(ticks(12)?)))
}

/// CPU time every CPU of the machine spent busy so far (`/proc/stat`: user, nice, system,
/// irq and softirq; not idle, iowait or steal).
pub fn machine_busy() -> anyhow::Result<Duration> {
    let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    machine_busy_of(&stat)
}

fn machine_busy_of(stat: &str) -> anyhow::Result<Duration> {
    let cpu = stat
        .lines()
        .find_map(|l| l.strip_prefix("cpu "))
        .context("no aggregate cpu line in /proc/stat")?;
    let f: Vec<u64> = cpu
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .context("malformed cpu line in /proc/stat")?;
    anyhow::ensure!(f.len() >= 7, "short cpu line in /proc/stat");
    // user nice system idle iowait irq softirq [steal guest guest_nice]
    let busy = f[0] + f[1] + f[2] + f[5] + f[6];
    Ok(Duration::from_secs_f64(busy as f64 / TICKS_PER_SECOND))
}

/// User + system and system-only CPU time of `pids`, summed (one read of each `stat`).
pub fn cpu_totals(pids: &[u32]) -> anyhow::Result<(Duration, Duration)> {
    pids.iter()
        .try_fold((Duration::ZERO, Duration::ZERO), |(all, sys), &pid| {
            let (user, system) = cpu_split(pid)?;
            Ok((all + user + system, sys + system))
        })
}

/// A `kB` field of `/proc/<pid>/status` (`VmRSS`, `VmHWM`), in MiB.
pub fn status_mib(pid: u32, field: &str) -> anyhow::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status: is the process gone?"))?;
    let prefix = format!("{field}:");
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .with_context(|| format!("no {field} in /proc/{pid}/status"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()?;
    Ok(kb / 1024.0)
}

/// Resident set size now, MiB.
pub fn rss_mib(pid: u32) -> anyhow::Result<f64> {
    status_mib(pid, "VmRSS")
}

/// Peak resident set size since the process started, MiB.
pub fn peak_rss_mib(pid: u32) -> anyhow::Result<f64> {
    status_mib(pid, "VmHWM")
}

/// Open file descriptors of `pid`.
pub fn fd_count(pid: u32) -> anyhow::Result<usize> {
    Ok(std::fs::read_dir(format!("/proc/{pid}/fd"))
        .with_context(|| format!("listing /proc/{pid}/fd"))?
        .count())
}

/// This process's soft `RLIMIT_NOFILE` (inherited by the processes it starts), from
/// `/proc/self/limits`; `None` when unlimited.
pub fn nofile_limit() -> anyhow::Result<Option<u64>> {
    let limits = std::fs::read_to_string("/proc/self/limits")?;
    let soft = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .and_then(|rest| rest.split_whitespace().next())
        .context("no `Max open files` in /proc/self/limits")?;
    Ok(soft.parse().ok())
}

#[cfg(test)]
mod tests;
