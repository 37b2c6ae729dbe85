//! cni-node's command line: subcommands, defaults and what a bad flag says.

use std::process::{Command, Output};

fn cni_node(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cni-node"))
        .args(args)
        .env_remove("AGENT_STATE_DIR")
        .output()
        .expect("run cni-node")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn help_lists_every_subcommand() {
    let out = cni_node(&["--help"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    for sub in ["run", "status", "install-cni", "uninstall-cni"] {
        assert!(text.contains(sub), "{sub} missing in:\n{text}");
    }
}

#[test]
fn bad_flags_exit_2_and_name_the_flag() {
    for (args, want) in [
        (&["install-cni", "--bogus"][..], "--bogus"),
        (&["uninstall-cni", "--watch"][..], "--watch"),
        (&["status", "-o", "yaml"][..], "yaml"),
        (&["status", "--state-dir"][..], "--state-dir"),
    ] {
        let out = cni_node(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(want), "{args:?}: {}", stderr(&out));
    }
}

#[test]
fn status_reads_the_state_directory_from_the_flag_or_the_environment() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().to_str().expect("utf-8");
    let out = cni_node(&["status", "--state-dir", path, "-o", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[]");
    let out = Command::new(env!("CARGO_BIN_EXE_cni-node"))
        .args(["status"])
        .env("AGENT_STATE_DIR", path)
        .output()
        .expect("run");
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("NAMESPACE"));
}
