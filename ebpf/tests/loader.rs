//! The embedded BPF object: the expected tc programs, and (as root) the kernel's verifier
//! accepts them.
#![cfg(feature = "bpf")]

use aya_obj::{Object, ProgramSection};
use mesh_ebpf::{object, Programs, PROGRAM_NAMES};

#[test]
fn object_has_the_three_tc_programs_and_no_maps() {
    let bytes = object().expect("built with the bpf feature");
    let parsed = Object::parse(bytes).expect("a valid BPF ELF object");
    let mut names: Vec<&str> = parsed.programs.keys().map(String::as_str).collect();
    names.sort_unstable();
    let mut expected = PROGRAM_NAMES.to_vec();
    expected.sort_unstable();
    assert_eq!(names, expected);
    for (name, program) in &parsed.programs {
        assert!(
            matches!(program.section, ProgramSection::SchedClassifier),
            "{name} is a tc classifier, got {:?}",
            program.section
        );
    }
    assert!(parsed.maps.is_empty(), "the programs need no maps");
    assert_eq!(
        parsed.license.to_str().expect("ASCII license"),
        "Apache-2.0"
    );
}

#[test]
fn kernel_verifier_accepts_the_programs() {
    if !mesh_testutil::netns::have_root("kernel_verifier_accepts_the_programs") {
        return;
    }
    let programs = Programs::load().expect("the verifier accepts every program");
    // Three distinct programs in the kernel.
    let ids = programs.kernel_ids().expect("program info");
    assert!(ids.iter().all(|&id| id != 0), "{ids:?}");
    assert!(
        ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2],
        "{ids:?}"
    );
}
