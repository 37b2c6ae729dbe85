//! What each file defines, which file wins for each key, and the events a batch of file
//! changes produces.
//!
//! Pure and synchronous: the directory watcher feeds it [`Change`]s and sends the events it
//! returns. Every key has an ordered list of files defining it; the first one wins, and when it
//! goes away the next one applies. Events are the difference of the winning objects before and
//! after a whole batch, so a file renamed within one batch emits nothing.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use std::sync::Arc;

use mesh_api::{Object, ObjectKey};

use crate::error::{Problem, SourceError};
use crate::parse::{Loaded, ParsedFile};
use crate::SourceEvent;

/// One file read again or gone.
#[derive(Debug)]
pub(crate) enum Change {
    Loaded(PathBuf, ParsedFile),
    Removed(PathBuf),
}

/// Objects by file and the owners of each key.
#[derive(Debug, Default)]
pub(crate) struct Store {
    /// The watched root (files under its status directory hold status, not objects).
    root: PathBuf,
    files: BTreeMap<PathBuf, FileObjects>,
    /// Files defining each key, in the order they started to; the first one wins.
    owners: HashMap<ObjectKey, Vec<PathBuf>>,
    /// Status files for each key, in the same order; the first one's status applies.
    status: HashMap<ObjectKey, Vec<PathBuf>>,
}

/// The new contents of one file (`None`: the file is gone).
type Update = (PathBuf, Option<FileObjects>);

/// The objects of one file by key. Most files define one object, so a sorted vector: a tree
/// would allocate a whole node for each file.
#[derive(Debug, Default, Clone)]
pub(crate) struct FileObjects(Vec<(ObjectKey, Loaded)>);

impl FileObjects {
    fn position(&self, key: &ObjectKey) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| k.cmp(key))
    }

    pub(crate) fn get(&self, key: &ObjectKey) -> Option<&Loaded> {
        self.position(key).ok().map(|i| &self.0[i].1)
    }

    fn contains_key(&self, key: &ObjectKey) -> bool {
        self.position(key).is_ok()
    }

    /// From entries with distinct keys, in any order.
    fn from_unique(mut entries: Vec<(ObjectKey, Loaded)>) -> FileObjects {
        entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        entries.shrink_to_fit();
        FileObjects(entries)
    }

    fn keys(&self) -> impl Iterator<Item = &ObjectKey> {
        self.0.iter().map(|(key, _)| key)
    }

    fn iter(&self) -> impl Iterator<Item = (&ObjectKey, &Loaded)> {
        self.0.iter().map(|(key, loaded)| (key, loaded))
    }
}

impl Store {
    /// A store for the files of the directory `root`.
    pub(crate) fn new(root: &Path) -> Store {
        Store {
            root: root.to_path_buf(),
            ..Store::default()
        }
    }

    fn owners_of(&mut self, path: &Path) -> &mut HashMap<ObjectKey, Vec<PathBuf>> {
        if crate::scan::is_status(&self.root, path) {
            &mut self.status
        } else {
            &mut self.owners
        }
    }

    /// Applies a batch and returns its events: `Invalid` first, then `Applied` / `Deleted` for
    /// every key whose winning object changed.
    pub(crate) fn apply(&mut self, changes: Vec<Change>) -> Vec<SourceEvent> {
        let mut errors = Vec::new();
        let mut updates: Vec<Update> = Vec::new();
        for change in changes {
            match change {
                Change::Removed(path) if self.files.contains_key(&path) => {
                    updates.push((path, None));
                }
                Change::Removed(_) => {}
                Change::Loaded(path, parsed) => {
                    if let Some(objects) = self.file_objects(&path, parsed, &mut errors) {
                        updates.push((path, Some(objects)));
                    }
                }
            }
        }
        let affected = self.affected(&updates);
        let before: Vec<Option<Arc<Object>>> =
            affected.iter().map(|key| self.winner(key)).collect();
        for (path, objects) in &updates {
            self.replace(path, objects.clone());
        }
        self.report_duplicates(&updates, &mut errors);
        let mut events: Vec<SourceEvent> = errors.into_iter().map(SourceEvent::Invalid).collect();
        for (key, before) in affected.into_iter().zip(before) {
            match (before, self.winner(&key)) {
                (Some(_), None) => events.push(SourceEvent::Deleted(key)),
                (before, Some(after)) if before.as_deref() != Some(&*after) => {
                    events.push(SourceEvent::Applied(after));
                }
                _ => {}
            }
        }
        events
    }

    /// The objects a parsed file now defines, or `None` if the file is unreadable (its earlier
    /// objects stay). Invalid documents whose key is known keep their earlier version.
    fn file_objects(
        &self,
        path: &Path,
        parsed: ParsedFile,
        errors: &mut Vec<SourceError>,
    ) -> Option<FileObjects> {
        let ParsedFile {
            objects,
            kept,
            errors: parse_errors,
            fatal,
        } = parsed;
        errors.extend(parse_errors);
        if fatal {
            return None;
        }
        let old = self.files.get(path);
        // The first definition of a key wins; the line of each key's first definition.
        let mut first_lines: HashMap<ObjectKey, usize> = HashMap::new();
        let mut entries = Vec::new();
        for loaded in objects {
            let key = loaded.object.key();
            if let Some(&first_line) = first_lines.get(&key) {
                errors.push(duplicate(path, &loaded, key, path, first_line));
                continue;
            }
            first_lines.insert(key.clone(), loaded.line);
            entries.push((key, loaded));
        }
        for key in kept {
            if first_lines.contains_key(&key) {
                continue;
            }
            if let Some(previous) = old.and_then(|o| o.get(&key)) {
                first_lines.insert(key.clone(), previous.line);
                entries.push((key, previous.clone()));
            }
        }
        Some(FileObjects::from_unique(entries))
    }

    /// Keys defined before or after by the updated files, each once, in file order.
    fn affected(&self, updates: &[Update]) -> Vec<ObjectKey> {
        let mut seen = HashSet::new();
        let mut keys = Vec::new();
        for (path, objects) in updates {
            let new_keys = objects.iter().flat_map(|o| o.keys());
            let old_keys = self.files.get(path).into_iter().flat_map(|o| o.keys());
            for key in new_keys.chain(old_keys) {
                if seen.insert(key.clone()) {
                    keys.push(key.clone());
                }
            }
        }
        keys
    }

    /// Replaces what `path` defines and updates the owner lists.
    fn replace(&mut self, path: &Path, objects: Option<FileObjects>) {
        let old = self.files.remove(path).unwrap_or_default();
        let empty = FileObjects::default();
        let new = objects.as_ref().unwrap_or(&empty);
        let owners = self.owners_of(path);
        for key in old.keys().filter(|k| !new.contains_key(k)) {
            if let Some(files) = owners.get_mut(key) {
                files.retain(|f| f != path);
                if files.is_empty() {
                    owners.remove(key);
                }
            }
        }
        for key in new.keys().filter(|k| !old.contains_key(k)) {
            owners
                .entry(key.clone())
                .or_default()
                .push(path.to_path_buf());
        }
        if let Some(objects) = objects {
            self.files.insert(path.to_path_buf(), objects);
        }
    }

    /// Reports every object of an updated file that another file defines first.
    fn report_duplicates(&self, updates: &[Update], errors: &mut Vec<SourceError>) {
        for (path, objects) in updates {
            if crate::scan::is_status(&self.root, path) {
                continue;
            }
            for (key, loaded) in objects.iter().flat_map(FileObjects::iter) {
                let Some(first) = self.owners.get(key).and_then(|f| f.first()) else {
                    continue;
                };
                if first != path {
                    let line = self
                        .files
                        .get(first)
                        .and_then(|o| o.get(key))
                        .map(|l| l.line);
                    errors.push(duplicate(
                        path,
                        loaded,
                        key.clone(),
                        first,
                        line.unwrap_or(0),
                    ));
                }
            }
        }
    }

    /// The winning object for `key`, with the status written for it (if any).
    fn winner(&self, key: &ObjectKey) -> Option<Arc<Object>> {
        let object = self.first_in(&self.owners, key)?;
        let merged = self
            .first_in(&self.status, key)
            .and_then(|status| object.with_status_of(status));
        Some(merged.map_or_else(|| Arc::clone(object), Arc::new))
    }

    fn first_in<'a>(
        &'a self,
        owners: &HashMap<ObjectKey, Vec<PathBuf>>,
        key: &ObjectKey,
    ) -> Option<&'a Arc<Object>> {
        let file = owners.get(key)?.first()?;
        self.files.get(file)?.get(key).map(|l| &l.object)
    }

    /// Files the store holds objects from under `prefix` (a file or directory).
    pub(crate) fn tracked_under(&self, prefix: &Path) -> Vec<PathBuf> {
        self.files
            .keys()
            .filter(|f| f.starts_with(prefix))
            .cloned()
            .collect()
    }

    /// The winning objects with their files, by file and then line.
    pub(crate) fn objects(&self) -> Vec<(PathBuf, Arc<Object>)> {
        let mut out = Vec::new();
        for (path, objects) in &self.files {
            let mut winners: Vec<(&ObjectKey, &Loaded)> = objects
                .iter()
                .filter(|(key, _)| self.owners.get(*key).and_then(|f| f.first()) == Some(path))
                .collect();
            winners.sort_by_key(|(_, l)| l.line);
            out.extend(
                winners
                    .into_iter()
                    .filter_map(|(key, _)| self.winner(key))
                    .map(|o| (path.clone(), o)),
            );
        }
        out
    }
}

fn duplicate(
    path: &Path,
    loaded: &Loaded,
    key: ObjectKey,
    first: &Path,
    first_line: usize,
) -> SourceError {
    let mut err = SourceError::file(
        path,
        Problem::Duplicate {
            first: first.to_path_buf(),
            line: (first_line > 0).then_some(first_line),
        },
    );
    err.line = Some(loaded.line);
    err.key = Some(key);
    err
}

#[cfg(test)]
mod tests;
