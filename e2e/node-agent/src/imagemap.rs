//! Maps container images (or container names) to local binaries.
//!
//! Rule: `--image-map KEY=/path/to/binary` may be repeated. For a container, the entry with the LONGEST key
//! that is a substring of the container's `image` wins; if no key occurs in the image, an entry whose key
//! EQUALS the container's `name` is used. What runs then:
//! * the container has no `command`: the mapped binary, with the container's `args`;
//! * it has a `command` whose first element exists on the host (absolute path, or found on the agent's PATH):
//!   that command as written, plus `args`;
//! * it has a `command` whose first element does not exist on the host (e.g. `/sweety-controller` from an
//!   image) and the image is mapped: the mapped binary replaces `command[0]`, the rest is kept.
//!
//! A KEY may also map to a DIRECTORY, standing for an image that holds several programs (our image holds
//! `sweety-controller` and `sweety-dataplane`): `command[0]`'s file name is looked up in that directory
//! first (so `command: [sweety-controller]` runs `<dir>/sweety-controller`); a container without a
//! `command`, or whose program is not in the directory, falls back to the rules above (a directory is never
//! run itself).

use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// The parsed `--image-map` entries.
#[derive(Debug, Clone, Default)]
pub struct ImageMap {
    entries: Vec<(String, PathBuf)>,
}

impl ImageMap {
    /// Parses `KEY=/path` entries.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Self> {
        let mut out = Vec::new();
        for e in entries {
            let e = e.as_ref();
            let (k, v) = e
                .split_once('=')
                .ok_or_else(|| Error::ImageMap(e.to_string()))?;
            if k.is_empty() || v.is_empty() {
                return Err(Error::ImageMap(e.to_string()));
            }
            out.push((k.to_string(), PathBuf::from(v)));
        }
        Ok(ImageMap { entries: out })
    }

    /// The binary for a container, by the rule in the module docs.
    pub fn lookup(&self, image: &str, container_name: &str) -> Option<&Path> {
        self.entries
            .iter()
            .filter(|(k, _)| image.contains(k.as_str()))
            .max_by_key(|(k, _)| k.len())
            .or_else(|| self.entries.iter().find(|(k, _)| k == container_name))
            .map(|(_, p)| p.as_path())
    }
}

/// The program and arguments to run for a container (see the module docs), or None when nothing can run.
pub fn resolve_command(
    map: &ImageMap,
    image: &str,
    name: &str,
    command: &[String],
    args: &[String],
) -> Option<(PathBuf, Vec<String>)> {
    let mut mapped = map.lookup(image, name);
    if let Some(dir) = mapped.filter(|p| p.is_dir()) {
        if let Some((first, rest)) = command.split_first() {
            if let Some(file) = Path::new(first).file_name() {
                let candidate = dir.join(file);
                if candidate.is_file() {
                    let mut all: Vec<String> = rest.to_vec();
                    all.extend(args.iter().cloned());
                    return Some((candidate, all));
                }
            }
        }
        mapped = None;
    }
    match command.split_first() {
        None => mapped.map(|b| (b.to_path_buf(), args.to_vec())),
        Some((first, rest)) => {
            let mut all: Vec<String> = rest.to_vec();
            all.extend(args.iter().cloned());
            if exists_on_host(first) {
                Some((PathBuf::from(first), all))
            } else {
                mapped.map(|b| (b.to_path_buf(), all))
            }
        }
    }
}

fn exists_on_host(program: &str) -> bool {
    if program.contains('/') {
        return Path::new(program).is_file();
    }
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn longest_image_substring_wins_then_container_name() {
        let m = ImageMap::parse(&[
            "sweety=/bin/a",
            "sweety-dataplane=/bin/b",
            "controller=/bin/c",
        ])
        .unwrap();
        assert_eq!(
            m.lookup("example.test/x/sweety-dataplane:1", "dp"),
            Some(Path::new("/bin/b"))
        );
        assert_eq!(
            m.lookup("example.test/x/sweety:1", "dp"),
            Some(Path::new("/bin/a"))
        );
        assert_eq!(m.lookup("busybox", "controller"), Some(Path::new("/bin/c")));
        assert_eq!(m.lookup("busybox", "other"), None);
        assert!(ImageMap::parse(&["nokey"]).is_err());
        assert!(ImageMap::parse(&["=/bin/x"]).is_err());
    }

    #[test]
    fn command_resolution() {
        let m = ImageMap::parse(&["echo=/opt/echo"]).unwrap();
        assert_eq!(
            resolve_command(&m, "echo:1", "c", &[], &s(&["-v"])),
            Some((PathBuf::from("/opt/echo"), s(&["-v"])))
        );
        // A command that exists on the host runs as written.
        assert_eq!(
            resolve_command(&m, "echo:1", "c", &s(&["/bin/sh", "-c"]), &s(&["true"])),
            Some((PathBuf::from("/bin/sh"), s(&["-c", "true"])))
        );
        // One that does not exist is replaced by the mapped binary.
        assert_eq!(
            resolve_command(
                &m,
                "echo:1",
                "c",
                &s(&["/nonexistent/echo", "--x"]),
                &s(&["y"])
            ),
            Some((PathBuf::from("/opt/echo"), s(&["--x", "y"])))
        );
        assert_eq!(resolve_command(&m, "other", "c", &[], &[]), None);
    }

    #[test]
    fn directory_maps_commands_by_file_name() {
        let dir = std::env::temp_dir().join(format!("sweety-imagemap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("sweety-controller"), b"").unwrap();
        let m = ImageMap::parse(&[format!("sweety/sweety={}", dir.display())]).unwrap();
        let img = "sweety/sweety:0.1.0";
        assert_eq!(
            resolve_command(
                &m,
                img,
                "controller",
                &s(&["sweety-controller"]),
                &s(&["--a"])
            ),
            Some((dir.join("sweety-controller"), s(&["--a"])))
        );
        assert_eq!(
            resolve_command(&m, img, "c", &s(&["/bin/sweety-controller", "x"]), &[]),
            Some((dir.join("sweety-controller"), s(&["x"])))
        );
        // Not in the directory: host rule; never the directory itself.
        assert_eq!(
            resolve_command(&m, img, "c", &s(&["/bin/sh"]), &[]),
            Some((PathBuf::from("/bin/sh"), vec![]))
        );
        assert_eq!(resolve_command(&m, img, "c", &s(&["nope-xyz"]), &[]), None);
        assert_eq!(resolve_command(&m, img, "c", &[], &[]), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
