//! Tensors stored outside the `.onnx` file (ONNX "external data": models
//! over 2 GB, or exported with `save_as_external_data`).
//!
//! A tensor names a `location` relative to the model's folder, and
//! optionally an `offset` and a `length` in that file. A model comes from
//! wherever its user got it, so by default a location must stay inside the
//! model's folder: absolute paths, `..` components and symbolic links on
//! the way are refused (a model must not make its loader read
//! `/etc/passwd` or `~/.ssh/id_rsa` into a tensor). [`ExternalData::Anywhere`]
//! lifts that for models the caller trusts.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Component, Path, PathBuf};

use mote_proto as pb;

use crate::error::{Error, Result};

/// Where external tensor data may be read from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ExternalData {
    /// Only regular files inside the model's folder, reached without
    /// symbolic links (the default).
    #[default]
    InsideModelFolder,
    /// Any path the process can read, links followed (trusted models only).
    Anywhere,
}

/// Replaces every external tensor of `model` (initializers, and tensors in
/// attributes, in subgraphs too) with the bytes it names, read relative to
/// `dir`. Returns the number of tensors read.
pub fn resolve(model: &mut pb::ModelProto, dir: &Path, policy: ExternalData) -> Result<usize> {
    let mut n = 0;
    if let Some(g) = model.graph.as_mut() {
        resolve_graph(g, dir, policy, &mut n)?;
    }
    Ok(n)
}

/// Whether any tensor of the model is stored externally.
pub fn has_external(model: &pb::ModelProto) -> bool {
    fn graph(g: &pb::GraphProto) -> bool {
        g.initializer.iter().any(is_external) || g.node.iter().any(|n| n.attribute.iter().any(attr))
    }
    fn attr(a: &pb::AttributeProto) -> bool {
        a.t.as_ref().is_some_and(is_external)
            || a.tensors.iter().any(is_external)
            || a.g.as_ref().is_some_and(graph)
            || a.graphs.iter().any(graph)
    }
    model.graph.as_ref().is_some_and(graph)
}

fn is_external(t: &pb::TensorProto) -> bool {
    t.data_location == Some(pb::tensor_proto::DataLocation::External as i32)
        || !t.external_data.is_empty()
}

fn resolve_graph(
    g: &mut pb::GraphProto,
    dir: &Path,
    policy: ExternalData,
    n: &mut usize,
) -> Result<()> {
    for t in &mut g.initializer {
        resolve_tensor(t, dir, policy, n)?;
    }
    for node in &mut g.node {
        for a in &mut node.attribute {
            if let Some(t) = a.t.as_mut() {
                resolve_tensor(t, dir, policy, n)?;
            }
            for t in &mut a.tensors {
                resolve_tensor(t, dir, policy, n)?;
            }
            if let Some(sub) = a.g.as_mut() {
                resolve_graph(sub, dir, policy, n)?;
            }
            for sub in &mut a.graphs {
                resolve_graph(sub, dir, policy, n)?;
            }
        }
    }
    Ok(())
}

fn resolve_tensor(
    t: &mut pb::TensorProto,
    dir: &Path,
    policy: ExternalData,
    n: &mut usize,
) -> Result<()> {
    if !is_external(t) {
        return Ok(());
    }
    let name = t.name.clone().unwrap_or_default();
    let bad = |what: String| Error::Model(format!("tensor '{name}': external data {what}"));
    let field = |key: &str| {
        t.external_data
            .iter()
            .find(|e| e.key.as_deref() == Some(key))
            .and_then(|e| e.value.clone())
    };
    let number = |key: &str| -> Result<Option<u64>> {
        field(key)
            .map(|v| {
                v.trim()
                    .parse::<u64>()
                    .map_err(|_| bad(format!("has a bad {key} '{v}'")))
            })
            .transpose()
    };
    let location = field("location").ok_or_else(|| bad("has no location".into()))?;
    let offset = number("offset")?.unwrap_or(0);
    let length = number("length")?;
    let path = locate(dir, &location, policy).map_err(|why| bad(format!("'{location}' {why}")))?;
    let mut f = File::open(&path).map_err(|e| Error::io(&path, e))?;
    let size = f.metadata().map_err(|e| Error::io(&path, e))?.len();
    let length = length.unwrap_or(size.saturating_sub(offset));
    if offset.checked_add(length).is_none_or(|end| end > size) {
        return Err(bad(format!(
            "'{location}': offset {offset} + length {length} is past the end of the file ({size} bytes)"
        )));
    }
    let len = usize::try_from(length).map_err(|_| bad("is too large".into()))?;
    let mut buf = Vec::new();
    buf.try_reserve_exact(len)
        .map_err(|_| bad(format!("of {len} bytes does not fit in memory")))?;
    f.seek(SeekFrom::Start(offset))
        .map_err(|e| Error::io(&path, e))?;
    f.take(length)
        .read_to_end(&mut buf)
        .map_err(|e| Error::io(&path, e))?;
    t.raw_data = Some(buf.into());
    t.external_data.clear();
    t.data_location = None;
    *n += 1;
    Ok(())
}

/// The file `location` names, relative to `dir`, if the policy allows it.
fn locate(
    dir: &Path,
    location: &str,
    policy: ExternalData,
) -> std::result::Result<PathBuf, String> {
    let rel = Path::new(location);
    if location.is_empty() {
        return Err("is empty".into());
    }
    if policy == ExternalData::Anywhere {
        return Ok(dir.join(rel));
    }
    // Lexical checks first: no root, no drive, no `..`, no backslash
    // paths that another OS would read as separators.
    if location.contains('\\') || location.contains('\0') {
        return Err("has a backslash or NUL".into());
    }
    for c in rel.components() {
        match c {
            Component::Normal(_) | Component::CurDir => {}
            Component::ParentDir => return Err("leaves the model's folder ('..')".into()),
            Component::RootDir | Component::Prefix(_) => {
                return Err(
                    "is an absolute path (only paths inside the model's folder are read)".into(),
                )
            }
        }
    }
    // Then no symbolic link on the way down from the folder.
    let mut p = dir.to_path_buf();
    for c in rel.components() {
        p.push(c);
        let meta = std::fs::symlink_metadata(&p).map_err(|e| format!("cannot be read: {e}"))?;
        if meta.file_type().is_symlink() {
            return Err(
                "goes through a symbolic link (refused: it may point outside the model's folder)"
                    .into(),
            );
        }
    }
    if !std::fs::metadata(&p).map(|m| m.is_file()).unwrap_or(false) {
        return Err("is not a regular file".into());
    }
    Ok(p)
}
