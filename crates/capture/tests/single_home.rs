//! The capture contract has one home: no code outside this crate spells its numbers. Comments
//! and test code may (they describe or check the wire); everything else names the constants.

use std::fs;
use std::path::{Path, PathBuf};

/// The contract's literals as code would spell them.
const LITERALS: &[&str] = &[
    "15001",
    "15006",
    "15008",
    "15053",
    "32763",
    "32764",
    "0x539",
    "0x111",
    "0xfff",
    "169.254.7.127",
    "169, 254, 7, 127",
    "0xfd16",
];

#[test]
fn no_code_outside_the_capture_crate_spells_the_contract() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = Vec::new();
    for member in workspace_members(&root) {
        if member == Path::new("crates/capture") {
            continue;
        }
        for dir in ["src", "bpf"] {
            collect(&root.join(&member).join(dir), &mut files);
        }
        let build = root.join(&member).join("build.rs");
        if build.is_file() {
            files.push(build);
        }
    }
    assert!(
        files.iter().any(|f| f.ends_with("ebpf/bpf/capture.bpf.c")),
        "the walk missed the BPF programs: {} files",
        files.len()
    );
    let mut found = Vec::new();
    for file in &files {
        let text = fs::read_to_string(file).expect("read source");
        for (number, line) in code_lines(&text) {
            for literal in LITERALS {
                if contains_token(line, literal) {
                    found.push(format!("{}:{number}: {}", file.display(), line.trim()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "use mesh_capture's constants instead of these literals:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_scanner_sees_code_and_skips_comments_and_tests() {
    let text = "// 15008 in a comment\nlet port = 15008;\n/// 0x539\n#[cfg(test)]\nmod tests {\n    const X: u16 = 15001;\n}\n";
    let lines: Vec<_> = code_lines(text).collect();
    assert_eq!(lines, vec![(2, "let port = 15008;")]);
    assert!(contains_token("port: 15008,", "15008"));
    assert!(!contains_token("port: 150080,", "15008"));
    assert!(!contains_token("0x1110", "0x111"));
}

/// `members = [...]` of the workspace manifest.
fn workspace_members(root: &Path) -> Vec<PathBuf> {
    let manifest = fs::read_to_string(root.join("Cargo.toml")).expect("workspace manifest");
    let start = manifest.find("members = [").expect("members");
    let end = start + manifest[start..].find(']').expect("end of members");
    manifest[start..end]
        .split('"')
        .skip(1)
        .step_by(2)
        .map(PathBuf::from)
        .collect()
}

fn collect(dir: &Path, files: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if path.is_dir() {
            if name != "tests" {
                collect(&path, files);
            }
        } else if name != "tests.rs"
            && path
                .extension()
                .is_some_and(|ext| ext == "rs" || ext == "c" || ext == "h")
        {
            files.push(path);
        }
    }
}

/// The lines that are code: not comments, and not in a `#[cfg(test)] mod … { … }` (which, as
/// everywhere in this workspace, ends its file).
fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let lines: Vec<&str> = text.lines().collect();
    let end = lines
        .windows(2)
        .position(|pair| {
            pair[0].trim() == "#[cfg(test)]"
                && pair[1].trim_start().starts_with("mod ")
                && pair[1].trim_end().ends_with('{')
        })
        .unwrap_or(lines.len());
    lines
        .into_iter()
        .take(end)
        .enumerate()
        .map(|(i, line)| (i + 1, line))
        .filter(|(_, line)| {
            let t = line.trim_start();
            !(t.starts_with("//") || t.starts_with("/*") || t.starts_with('*'))
        })
        .map(|(number, line)| (number, line.split(" // ").next().unwrap_or(line)))
}

fn contains_token(line: &str, literal: &str) -> bool {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    line.match_indices(literal).any(|(at, _)| {
        let before = line[..at].chars().next_back();
        let after = line[at + literal.len()..].chars().next();
        !before.is_some_and(word) && !after.is_some_and(word)
    })
}
