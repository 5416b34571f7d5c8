//! Mapping a sanitised request path onto a file: `try_files` candidates, directory
//! redirects and index files. Only `stat` calls; containment is checked later, on open.

use super::path::{self, CleanPath};
use http::StatusCode;
use std::fs::{self, Metadata};
use std::io;
use std::path::{Path, PathBuf};
use sweety_config::StaticSite;

/// Candidates used when `try_files` is empty: the file, else the directory's index.
const DEFAULT_CANDIDATES: [&str; 2] = ["$uri", "$uri/"];

/// The outcome of resolving a request.
#[derive(Debug)]
pub(crate) enum Resolution {
    /// Serve this regular file (the root-joined, not yet canonicalised path).
    File { path: PathBuf, meta: Metadata },
    /// The path names a directory but lacks the trailing slash: redirect.
    Redirect,
    /// A `=CODE` candidate was reached.
    Status(StatusCode),
    /// Nothing matched.
    NotFound,
    /// Nothing matched and a candidate failed with this error (e.g. permission denied).
    Io(io::Error),
}

enum Step {
    Found(Resolution),
    Missing,
    Failed(io::Error),
}

fn is_absent(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
    )
}

/// A regular file at `path`?
fn try_file(path: PathBuf) -> Step {
    match fs::metadata(&path) {
        Ok(meta) if meta.is_file() => Step::Found(Resolution::File { path, meta }),
        Ok(_) => Step::Missing,
        Err(e) if is_absent(&e) => Step::Missing,
        Err(e) => Step::Failed(e),
    }
}

/// A directory at `root/rel`: a redirect when `redirect`, else its first index file.
fn try_dir(site: &StaticSite, root: &Path, rel: &str, redirect: bool) -> Step {
    let dir = root.join(rel);
    match fs::metadata(&dir) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => return Step::Missing,
        Err(e) if is_absent(&e) => return Step::Missing,
        Err(e) => return Step::Failed(e),
    }
    if redirect {
        return Step::Found(Resolution::Redirect);
    }
    let mut failed = None;
    for index in &site.index {
        match try_file(dir.join(index)) {
            Step::Missing => {}
            Step::Failed(e) => {
                failed.get_or_insert(e);
            }
            found => return found,
        }
    }
    failed.map_or(Step::Missing, Step::Failed)
}

/// Resolves `req` against `site` (its `try_files`, or the file-then-directory default).
pub(crate) fn resolve(site: &StaticSite, req: &CleanPath<'_>) -> Resolution {
    let root = site.root.as_path();
    let configured = site.try_files.len();
    let count = if configured == 0 {
        DEFAULT_CANDIDATES.len()
    } else {
        configured
    };
    let candidates = (0..count).map(|i| match configured {
        0 => DEFAULT_CANDIDATES[i],
        _ => site.try_files[i].as_str(),
    });
    let mut failed: Option<io::Error> = None;
    for cand in candidates {
        let step = match cand {
            "$uri" if req.trailing_slash => Step::Missing,
            "$uri" => try_file(root.join(&*req.rel)),
            "$uri/" => try_dir(site, root, &req.rel, !req.trailing_slash),
            code if code.starts_with('=') => {
                return code[1..]
                    .trim()
                    .parse::<u16>()
                    .ok()
                    .and_then(|c| StatusCode::from_u16(c).ok())
                    .map_or(Resolution::NotFound, Resolution::Status);
            }
            literal => {
                let expanded = if literal.contains("$uri") {
                    literal.replace("$uri", &req.to_uri())
                } else {
                    literal.to_owned()
                };
                match path::clean(&expanded) {
                    Ok(p) if p.trailing_slash => try_dir(site, root, &p.rel, false),
                    Ok(p) => try_file(root.join(&*p.rel)),
                    Err(_) => Step::Missing,
                }
            }
        };
        match step {
            Step::Found(r) => return r,
            Step::Missing => {}
            Step::Failed(e) => {
                failed.get_or_insert(e);
            }
        }
    }
    failed.map_or(Resolution::NotFound, Resolution::Io)
}
