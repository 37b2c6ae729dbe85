use super::*;

#[test]
fn reads_own_process() {
    let me = std::process::id();
    assert!(rss_mib(me).expect("rss") > 0.0);
    assert!(peak_rss_mib(me).expect("hwm") >= rss_mib(me).expect("rss") * 0.5);
    assert!(fd_count(me).expect("fds") >= 3);
    let spin = std::time::Instant::now();
    while spin.elapsed() < Duration::from_millis(50) {
        std::hint::black_box(0u64);
    }
    assert!(cpu_time(me).expect("cpu") > Duration::ZERO);
}

#[test]
fn reads_nofile_limit() {
    let limit = nofile_limit().expect("limit");
    assert!(limit.is_none_or(|n| n >= 3), "{limit:?}");
}
