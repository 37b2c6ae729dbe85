//! Running `ip` and `nft`, with the command line and stderr in every error.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use super::NetnsError;

/// Runs `cmd` (feeding `stdin` when given) and returns its output; a failed status is an error.
pub(super) fn run_checked(cmd: &mut Command, stdin: Option<&str>) -> Result<Output, NetnsError> {
    let output = run(cmd, stdin)?;
    if output.status.success() {
        return Ok(output);
    }
    let mut stderr = String::from_utf8_lossy(&output.stderr).trim().to_owned();
    if let Some(input) = stdin {
        stderr.push_str(&format!(" (input: {})", input.trim().replace('\n', "; ")));
    }
    Err(NetnsError::Command {
        command: describe(cmd),
        status: output.status,
        stderr,
    })
}

/// Runs `cmd` and returns its output whatever the status.
pub(super) fn run(cmd: &mut Command, stdin: Option<&str>) -> Result<Output, NetnsError> {
    let program = describe(cmd);
    let spawn_error = |source| NetnsError::Spawn {
        program: program.clone(),
        source,
    };
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(spawn_error)?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        // A failed write shows up as the command's own error (it read a truncated input).
        let _ = pipe.write_all(input.as_bytes());
    }
    child.wait_with_output().map_err(spawn_error)
}

/// `ip [-n <netns>] <args>`, failing on a non-zero status; returns stdout.
pub(super) fn ip(netns: Option<&str>, args: &[&str]) -> Result<String, NetnsError> {
    let mut cmd = ip_command(netns);
    cmd.args(args);
    let output = run_checked(&mut cmd, None)?;
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// `ip [-n <netns>] -batch -` with one command per line (without the leading `ip`).
pub(super) fn ip_batch(netns: Option<&str>, lines: &[String]) -> Result<(), NetnsError> {
    if lines.is_empty() {
        return Ok(());
    }
    let mut cmd = ip_command(netns);
    cmd.args(["-batch", "-"]);
    run_checked(&mut cmd, Some(&(lines.join("\n") + "\n")))?;
    Ok(())
}

/// `ip netns exec <netns> nft -f -` with `script` on stdin.
pub(super) fn nft(netns: &str, script: &str) -> Result<(), NetnsError> {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", netns, "nft", "-f", "-"]);
    run_checked(&mut cmd, Some(script))?;
    Ok(())
}

fn ip_command(netns: Option<&str>) -> Command {
    let mut cmd = Command::new("ip");
    if let Some(name) = netns {
        cmd.args(["-n", name]);
    }
    cmd
}

fn describe(cmd: &Command) -> String {
    let mut text = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        text.push(' ');
        text.push_str(&arg.to_string_lossy());
    }
    text
}
