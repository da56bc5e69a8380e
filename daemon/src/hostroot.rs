//! `HostRoot`: every path the daemon reads from the host (`/sys`, `/proc`, `/dev`, `/etc`) is
//! resolved under a root prefix, so the same collectors run on the machine (`/`) and on a fixture
//! tree in tests (`../shared/fixtures/hosts/node-exporter`).

use std::io;
use std::path::{Path, PathBuf};

/// A root prefix for host paths. `HostRoot::default()` is `/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRoot {
    root: PathBuf,
}

impl Default for HostRoot {
    fn default() -> Self {
        Self {
            root: PathBuf::from("/"),
        }
    }
}

impl HostRoot {
    /// A root at `root` (a directory that holds `sys/`, `proc/`, ...).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The prefix itself.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `abs` (an absolute host path such as `/sys/class/net`) under the root.
    pub fn path(&self, abs: impl AsRef<Path>) -> PathBuf {
        let abs = abs.as_ref();
        let rel = abs.strip_prefix("/").unwrap_or(abs);
        self.root.join(rel)
    }

    /// Reads a file under the root as UTF-8 (lossy) text.
    pub fn read_to_string(&self, abs: impl AsRef<Path>) -> io::Result<String> {
        let bytes = std::fs::read(self.path(abs))?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Reads a sysfs-style one-value file: trimmed, `None` when missing, unreadable or empty.
    pub fn read_trimmed(&self, abs: impl AsRef<Path>) -> Option<String> {
        let s = self.read_to_string(abs).ok()?;
        let t = s.trim();
        (!t.is_empty()).then(|| t.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absolute_paths_resolve_under_the_prefix() {
        let r = HostRoot::new("/tmp/fixture");
        assert_eq!(
            r.path("/sys/class/net"),
            PathBuf::from("/tmp/fixture/sys/class/net")
        );
        assert_eq!(
            HostRoot::default().path("/proc/cpuinfo"),
            PathBuf::from("/proc/cpuinfo")
        );
    }
}
