//! Turns the text of one file into typed objects and located errors.
//!
//! YAML files may hold several documents (`---`); JSON files one or more concatenated values.
//! A document of kind `List` (or `PodList`, ...) is expanded into its `items`. A syntax error
//! anywhere makes the whole file unreadable ([`ParsedFile::fatal`]); a document the decoder
//! rejects is reported and the file's other documents still count.

mod locate;

use std::path::Path;

use std::sync::Arc;

use mesh_api::{ApiError, Kind, Object, ObjectKey};
use serde_json::Value;

use crate::error::{Problem, SourceError};

pub(crate) use locate::locate;

/// An object decoded from a file, with its 1-based line.
#[derive(Debug, Clone)]
pub(crate) struct Loaded {
    pub object: Arc<Object>,
    pub line: usize,
}

/// Everything read from one file.
#[derive(Debug, Default)]
pub(crate) struct ParsedFile {
    /// Valid objects, in file order.
    pub objects: Vec<Loaded>,
    /// Keys of invalid documents whose previously loaded version stays.
    pub kept: Vec<ObjectKey>,
    pub errors: Vec<SourceError>,
    /// The file could not be read or parsed at all: everything loaded from it earlier stays.
    pub fatal: bool,
}

impl ParsedFile {
    pub(crate) fn fatal(error: SourceError) -> Self {
        ParsedFile {
            errors: vec![error],
            fatal: true,
            ..ParsedFile::default()
        }
    }
}

/// One document of a file: its value and where it is.
struct Document {
    value: Value,
    /// 0-based first content line and the line after the document.
    start: usize,
    end: usize,
}

/// Where the documents of one file come from, for error locations.
struct Context<'a> {
    path: &'a Path,
    lines: &'a [&'a str],
    /// 1-based document index, reported only when the file holds several documents.
    document: Option<usize>,
}

/// Parses the text of `path` (YAML, or JSON when the name ends in `.json`).
pub(crate) fn parse_file(path: &Path, text: &str) -> ParsedFile {
    let is_json = path.extension().is_some_and(|e| e == "json");
    let documents = if is_json {
        json_documents(text)
    } else {
        yaml_documents(text)
    };
    let documents = match documents {
        Ok(docs) => docs,
        Err((format, line, column, message)) => {
            let mut err = SourceError::file(path, Problem::Syntax { format, message });
            err.line = line;
            err.column = column;
            return ParsedFile::fatal(err);
        }
    };
    let several = documents.len() > 1;
    let lines: Vec<&str> = text.lines().collect();
    let mut out = ParsedFile::default();
    for (i, doc) in documents.into_iter().enumerate() {
        let cx = Context {
            path,
            lines: &lines,
            document: several.then_some(i + 1),
        };
        decode_document(&cx, doc, &mut out);
    }
    out
}

type SyntaxError = (&'static str, Option<usize>, Option<usize>, String);

/// Splits YAML text at `---` / `...` lines and parses each non-empty document.
///
/// Document markers are only recognized at column 0, where the YAML spec forbids them inside
/// content, so splitting by line is exact. Each document is parsed with its line offset kept
/// (blank lines prepended), so parser errors carry the file's line numbers.
fn yaml_documents(text: &str) -> Result<Vec<Document>, SyntaxError> {
    let mut docs = Vec::new();
    let mut chunk = String::new();
    let mut chunk_start = 0;
    let mut lines = 0;
    for (i, line) in text.lines().enumerate() {
        lines = i + 1;
        let marker = ["---", "..."]
            .into_iter()
            .find(|m| line == *m || line.starts_with(&format!("{m} ")));
        if let Some(marker) = marker {
            finish_yaml(&chunk, chunk_start, i, &mut docs)?;
            chunk.clear();
            chunk_start = i;
            if marker == "---" {
                // Keep content after `--- ` (e.g. `--- {a: 1}`) at its column.
                chunk.push_str(&format!("   {}", &line[3..]));
            }
        } else if !(chunk.trim().is_empty() && line.starts_with('%')) {
            chunk.push_str(line);
        }
        chunk.push('\n');
    }
    finish_yaml(&chunk, chunk_start, lines, &mut docs)?;
    Ok(docs)
}

fn finish_yaml(
    chunk: &str,
    start: usize,
    end: usize,
    docs: &mut Vec<Document>,
) -> Result<(), SyntaxError> {
    let Some(first) = chunk.lines().position(|l| {
        let t = l.trim();
        !t.is_empty() && !t.starts_with('#')
    }) else {
        return Ok(());
    };
    let padded = format!("{}{chunk}", "\n".repeat(start));
    let value: Value = serde_yaml::from_str(&padded).map_err(|e| {
        let loc = e.location();
        let message = e.to_string();
        // serde_yaml appends " at line L column C"; the location is shown separately.
        let message = match message.find(" at line ") {
            Some(at) => message[..at].to_string(),
            None => message,
        };
        (
            "YAML",
            loc.as_ref().map(|l| l.line()),
            loc.as_ref().map(|l| l.column()),
            message,
        )
    })?;
    if !value.is_null() {
        docs.push(Document {
            value,
            start: start + first,
            end,
        });
    }
    Ok(())
}

/// Parses one or more concatenated JSON values.
fn json_documents(text: &str) -> Result<Vec<Document>, SyntaxError> {
    let mut docs = Vec::new();
    let mut stream = serde_json::Deserializer::from_str(text).into_iter::<Value>();
    let mut offset = 0;
    loop {
        let next = stream.next();
        let Some(next) = next else {
            break;
        };
        let value = next.map_err(|e| {
            let msg = e.to_string();
            let msg = match msg.find(" at line ") {
                Some(at) => msg[..at].to_string(),
                None => msg,
            };
            ("JSON", Some(e.line()), Some(e.column()), msg)
        })?;
        let skipped = text[offset..].len() - text[offset..].trim_start().len();
        let start = text[..offset + skipped].matches('\n').count();
        offset = stream.byte_offset();
        let end = text[..offset].matches('\n').count() + 1;
        if !value.is_null() {
            docs.push(Document { value, start, end });
        }
    }
    Ok(docs)
}

fn decode_document(cx: &Context<'_>, doc: Document, out: &mut ParsedFile) {
    let Document { value, start, end } = doc;
    let Value::Object(map) = value else {
        out.errors
            .push(located(cx, start, None, None, Problem::NotAnObject));
        return;
    };
    let kind = map.get("kind").and_then(Value::as_str).unwrap_or_default();
    let api_version = map.get("apiVersion").and_then(Value::as_str);
    let is_list =
        kind.ends_with("List") && Kind::from_type(api_version.unwrap_or(""), kind).is_none();
    if !is_list {
        decode_object(cx, (start, end), None, Value::Object(map), out);
        return;
    }
    let item_kind = kind.strip_suffix("List").filter(|k| !k.is_empty());
    let (item_kind, api_version) = (
        item_kind.map(str::to_string),
        api_version.map(str::to_string),
    );
    let Some(Value::Array(items)) = map.get("items").cloned() else {
        let problem = Problem::ListWithoutItems {
            kind: kind.to_string(),
        };
        out.errors.push(located(cx, start, None, None, problem));
        return;
    };
    for (i, mut item) in items.into_iter().enumerate() {
        // Typed lists (`PodList`) may leave apiVersion/kind out of their items.
        if let (Some(obj), Some(k), Some(v)) = (item.as_object_mut(), &item_kind, &api_version) {
            obj.entry("kind")
                .or_insert_with(|| Value::String(k.clone()));
            obj.entry("apiVersion")
                .or_insert_with(|| Value::String(v.clone()));
        }
        decode_object(cx, (start, end), Some(i), item, out);
    }
}

/// Decodes one object; on failure reports it and remembers its key (if readable) as kept.
fn decode_object(
    cx: &Context<'_>,
    (start, end): (usize, usize),
    item: Option<usize>,
    value: Value,
    out: &mut ParsedFile,
) {
    let prefix = item.map(|i| format!("items[{i}]")).unwrap_or_default();
    let key = untyped_key(&value);
    match Object::from_value(value) {
        Ok(object) => {
            let line = locate(cx.lines, start, end, &prefix) + 1;
            out.objects.push(Loaded {
                object: Arc::new(object),
                line,
            });
        }
        Err(err) => {
            let path = format!("{prefix}.{}", error_path(&err));
            let line = locate(cx.lines, start, end, &path);
            if let Some(key) = &key {
                out.kept.push(key.clone());
            }
            let problem = Problem::InvalidObject(err);
            out.errors.push(located(cx, line, item, key, problem));
        }
    }
}

/// The field to point at for a decoder error.
fn error_path(err: &ApiError) -> &str {
    match err {
        ApiError::InvalidField { path, .. } => path,
        ApiError::UnsupportedKind { .. } => "kind",
        ApiError::MissingName { .. } => "metadata",
        ApiError::MissingTypeField { field } => field,
    }
}

/// The key of a document that did not decode, read without types; `None` if its kind is not
/// one the mesh reads or it has no name.
pub(crate) fn untyped_key(value: &Value) -> Option<ObjectKey> {
    let kind = Kind::from_type(
        value.get("apiVersion")?.as_str()?,
        value.get("kind")?.as_str()?,
    )?;
    let name = value.pointer("/metadata/name")?.as_str()?;
    if name.is_empty() {
        return None;
    }
    let namespace = if kind.namespaced() {
        value
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .filter(|ns| !ns.is_empty())
            .unwrap_or("default")
    } else {
        ""
    };
    Some(ObjectKey::new(kind, namespace, name))
}

fn located(
    cx: &Context<'_>,
    line: usize,
    item: Option<usize>,
    key: Option<ObjectKey>,
    problem: Problem,
) -> SourceError {
    SourceError {
        file: cx.path.to_path_buf(),
        line: Some(line + 1),
        column: None,
        document: cx.document,
        item: item.map(|i| i + 1),
        key,
        problem,
    }
}

#[cfg(test)]
mod tests;
