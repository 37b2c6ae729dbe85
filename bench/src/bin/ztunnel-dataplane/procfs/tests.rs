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
    let (all, system) = cpu_totals(&[me]).expect("cpu");
    assert!(all > Duration::ZERO && all >= system);
}

#[test]
fn reads_nofile_limit() {
    let limit = nofile_limit().expect("limit");
    assert!(limit.is_none_or(|n| n >= 3), "{limit:?}");
}

#[test]
fn machine_busy_sums_busy_fields_and_names_bad_input() {
    let stat = "cpu  100 5 50 1000 7 3 2 9 0 0\ncpu0 50 2 25 500 3 1 1 4 0 0\n";
    // user + nice + system + irq + softirq = 160 ticks; idle, iowait and steal excluded.
    assert_eq!(
        machine_busy_of(stat).expect("parsed"),
        Duration::from_millis(1600)
    );
    let err = machine_busy_of("cpu0 1 2 3\n").expect_err("no aggregate line");
    assert!(err.to_string().contains("no aggregate cpu line"), "{err}");
    let err = machine_busy_of("cpu  1 x 3 4 5 6 7\n").expect_err("bad number");
    assert!(err.to_string().contains("malformed"), "{err}");
    assert!(machine_busy().expect("live") > Duration::ZERO);
}
