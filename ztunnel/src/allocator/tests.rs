use super::*;

fn env_of(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
    move |name| {
        vars.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.to_string())
    }
}

#[test]
fn all_parameters_when_the_environment_sets_none() {
    assert_eq!(
        settings(env_of(&[])),
        vec![
            (Param::ArenaMax, ARENA_MAX),
            (Param::MmapThreshold, MMAP_THRESHOLD),
            (Param::TrimThreshold, TRIM_THRESHOLD),
        ]
    );
}

#[test]
fn operator_environment_wins() {
    let got = settings(env_of(&[("MALLOC_ARENA_MAX", "4")]));
    assert_eq!(
        got,
        vec![
            (Param::MmapThreshold, MMAP_THRESHOLD),
            (Param::TrimThreshold, TRIM_THRESHOLD)
        ]
    );
    let got = settings(env_of(&[(
        "GLIBC_TUNABLES",
        "glibc.malloc.trim_threshold=1000:glibc.malloc.mmap_threshold=2000",
    )]));
    assert_eq!(got, vec![(Param::ArenaMax, ARENA_MAX)]);
    // Another tunable with a common prefix does not count.
    let got = settings(env_of(&[("GLIBC_TUNABLES", "glibc.malloc.arena_max_x=1")]));
    assert_eq!(got.len(), 3);
}

#[test]
fn glibc_accepts_the_values() {
    for (param, value) in settings(env_of(&[])) {
        assert!(set(param, value), "mallopt refused {param:?}={value}");
    }
    // The allocator still works after the change.
    let big = vec![1u8; 2 * 1024 * 1024];
    assert_eq!(
        big.iter().map(|b| *b as usize).sum::<usize>(),
        2 * 1024 * 1024
    );
}
