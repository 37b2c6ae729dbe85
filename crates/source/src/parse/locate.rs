//! Finds the line of a field path (`spec.ports[0].port`) in block-style YAML (or pretty-printed
//! JSON) text, so that errors point at the field rather than at the document.
//!
//! This is a best-effort scan of indentation, not a YAML parser: when a step cannot be followed
//! (flow style, anchors, unusual layout) the deepest line found so far is returned.

/// One step of a field path.
#[derive(Debug, PartialEq)]
enum Step<'a> {
    Key(&'a str),
    Index(usize),
}

/// Where the scan is: a line and what kind of node starts there.
#[derive(Debug, Clone, Copy)]
struct Cursor {
    line: usize,
    /// Column of the node's key or dash; `None` for the document root.
    col: Option<usize>,
    /// The node starts with `- ` (its first child may be on the same line).
    item: bool,
}

/// The parts of one non-blank, non-comment line.
struct LineInfo<'a> {
    indent: usize,
    /// Column of the first `- ` marker, if any.
    dash: Option<usize>,
    /// Column where the content after any `- ` markers starts.
    col: usize,
    rest: &'a str,
}

/// Returns the 0-based line of `path` inside `lines[start..end]`, or the closest enclosing
/// field's line; `start` when nothing matches.
pub(crate) fn locate(lines: &[&str], start: usize, end: usize, path: &str) -> usize {
    let end = end.min(lines.len());
    let mut cursor = Cursor {
        line: start,
        col: None,
        item: false,
    };
    for step in steps(path) {
        let found = match step {
            Step::Key(key) => find_key(lines, end, cursor, key),
            Step::Index(index) => find_index(lines, end, cursor, index),
        };
        match found {
            Some(next) => cursor = next,
            None => break,
        }
    }
    cursor.line
}

/// Splits `spec.ports[0].port` into steps; stops at segments it cannot follow (`?`).
fn steps(path: &str) -> Vec<Step<'_>> {
    let mut out = Vec::new();
    for piece in path.split('.').filter(|p| !p.is_empty()) {
        let (name, mut indices) = piece.split_once('[').unwrap_or((piece, ""));
        if name == "?" {
            break;
        }
        if !name.is_empty() {
            out.push(Step::Key(name));
        }
        while let Some((index, after)) = indices.split_once(']') {
            match index.parse() {
                Ok(i) => out.push(Step::Index(i)),
                Err(_) => return out,
            }
            indices = after.trim_start_matches('[');
        }
    }
    out
}

fn line_info(line: &str) -> Option<LineInfo<'_>> {
    let trimmed = line.trim_start_matches(' ');
    if trimmed.trim().is_empty() || trimmed.starts_with('#') {
        return None;
    }
    let indent = line.len() - trimmed.len();
    let (mut col, mut rest, mut dash) = (indent, trimmed, None);
    while rest == "-" || rest.starts_with("- ") {
        dash.get_or_insert(col);
        let after = rest[1..].trim_start_matches(' ');
        col += rest.len() - after.len();
        rest = after;
    }
    Some(LineInfo {
        indent,
        dash,
        col,
        rest,
    })
}

/// The mapping key at the start of `rest` (`name: x`, `"name": x`, `'name': x`).
fn key_token(rest: &str) -> Option<&str> {
    let (key, after) = if let Some(quoted) = rest.strip_prefix('"') {
        let (key, after) = quoted.split_once('"')?;
        (key, after.trim_start_matches(' ').strip_prefix(':')?)
    } else if let Some(quoted) = rest.strip_prefix('\'') {
        let (key, after) = quoted.split_once('\'')?;
        (key, after.trim_start_matches(' ').strip_prefix(':')?)
    } else {
        let (key, after) = rest.split_once(':')?;
        if key.contains(['{', '[', ' ', '"', '\'']) {
            return None;
        }
        (key, after)
    };
    (after.is_empty() || after.starts_with([' ', '\t'])).then_some(key)
}

/// Whether `info` (on a line after the cursor's) is outside the cursor's node.
fn leaves(cursor: Cursor, info: &LineInfo<'_>) -> bool {
    let Some(col) = cursor.col else {
        return false;
    };
    // A key's sequence value may sit at the key's own indentation (`ports:\n- port: 80`).
    info.indent < col || (info.indent == col && (cursor.item || info.dash.is_none()))
}

fn find_key(lines: &[&str], end: usize, cursor: Cursor, key: &str) -> Option<Cursor> {
    let first = if cursor.col.is_none() || cursor.item {
        cursor.line
    } else {
        cursor.line + 1
    };
    let mut child_col = None;
    for (i, line) in lines.iter().enumerate().take(end).skip(first) {
        let Some(info) = line_info(line) else {
            continue;
        };
        if i > cursor.line && leaves(cursor, &info) {
            return None;
        }
        let Some(token) = key_token(info.rest) else {
            continue;
        };
        let child = *child_col.get_or_insert(info.col);
        if info.col == child && token == key {
            return Some(Cursor {
                line: i,
                col: Some(info.col),
                item: false,
            });
        }
    }
    None
}

fn find_index(lines: &[&str], end: usize, cursor: Cursor, index: usize) -> Option<Cursor> {
    let mut seq_col = None;
    let mut seen = 0;
    for (i, line) in lines.iter().enumerate().take(end).skip(cursor.line + 1) {
        let Some(info) = line_info(line) else {
            continue;
        };
        if leaves(cursor, &info) {
            return None;
        }
        let Some(dash) = info.dash else {
            continue;
        };
        if *seq_col.get_or_insert(dash) != dash {
            continue;
        }
        if seen == index {
            return Some(Cursor {
                line: i,
                col: Some(dash),
                item: true,
            });
        }
        seen += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const SERVICE: &str = "\
apiVersion: v1
kind: Service
metadata:
  name: s
  labels:
    name: not-this
spec:
  selector:
    app: a
  ports:
  - name: http
    port: 80
  - name: grpc
    # comment
    port: eighty
";

    fn at(text: &str, path: &str) -> usize {
        let lines: Vec<&str> = text.lines().collect();
        locate(&lines, 0, lines.len(), path) + 1
    }

    #[test]
    fn finds_nested_keys_and_sequence_items() {
        assert_eq!(at(SERVICE, "metadata.name"), 4);
        assert_eq!(at(SERVICE, "spec.ports[1].port"), 15);
        assert_eq!(at(SERVICE, "spec.ports[1]"), 13);
        assert_eq!(at(SERVICE, "spec.ports[0].name"), 11);
        assert_eq!(at(SERVICE, "spec.selector.app"), 9);
    }

    #[test]
    fn falls_back_to_the_deepest_found_field() {
        assert_eq!(at(SERVICE, "spec.ports[7].port"), 10);
        assert_eq!(at(SERVICE, "spec.nodeName"), 7);
        assert_eq!(at(SERVICE, "."), 1);
        assert_eq!(at("a: {b: [1, 2]}\n", "a.b[1]"), 1);
    }

    #[test]
    fn follows_pretty_printed_json() {
        let json = "{\n  \"kind\": \"Pod\",\n  \"spec\": {\n    \"nodeName\": 3\n  }\n}\n";
        assert_eq!(at(json, "spec.nodeName"), 4);
    }

    #[test]
    fn parses_paths() {
        assert_eq!(
            steps("spec.ports[0][2].port"),
            vec![
                Step::Key("spec"),
                Step::Key("ports"),
                Step::Index(0),
                Step::Index(2),
                Step::Key("port")
            ]
        );
    }
}
