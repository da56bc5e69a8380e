//! `HostRoot`: every path the daemon reads from the host (`/sys`, `/proc`, `/dev`, `/etc`) is
//! resolved under a root prefix, so the same collectors run on the machine (`/`) and on a fixture
//! tree in tests (`../shared/fixtures/hosts/node-exporter`).
//!
//! Fixture trees made from archives (node_exporter's `ttar` fixtures) store a symlink as a small
//! regular file whose content is the link target (`../../devices/pci0000:00/.../net/eth0/`). Under
//! a root other than `/`, such "link files" are followed like symlinks, so `/sys/class/net/eth0`
//! leads to the device directory as it does on a live machine. Under `/` nothing is rewritten.

use std::io;
use std::path::{Component, Path, PathBuf};

/// Symlink hops followed while resolving one path; sysfs needs a handful.
const MAX_LINK_HOPS: usize = 40;
/// A link file is tiny; anything larger is data.
const MAX_LINK_FILE_BYTES: u64 = 512;

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

    /// True for the running machine's own root (`/`): live-only probes (ioctls) are allowed.
    pub fn is_live(&self) -> bool {
        self.root == Path::new("/")
    }

    /// `abs` (an absolute host path such as `/sys/class/net`) under the root, not following links.
    pub fn path(&self, abs: impl AsRef<Path>) -> PathBuf {
        let abs = abs.as_ref();
        let rel = abs.strip_prefix("/").unwrap_or(abs);
        self.root.join(rel)
    }

    /// `abs` under the root, with fixture link files followed (see the module docs). On a live
    /// root, or when the plain path exists, this is [`HostRoot::path`].
    pub fn resolve(&self, abs: impl AsRef<Path>) -> PathBuf {
        self.resolve_inner(abs.as_ref(), true)
    }

    fn resolve_inner(&self, abs: &Path, follow_last: bool) -> PathBuf {
        let direct = self.path(abs);
        if self.is_live() {
            return direct;
        }
        // A link file named by the path itself (`/sys/block/mmcblk0` in a fixture tree) is
        // followed like the others when the last component is followed.
        if direct.exists() && (!follow_last || link_file_target(&direct).is_none()) {
            return direct;
        }
        let mut cur: Vec<std::ffi::OsString> = Vec::new();
        let mut queue: std::collections::VecDeque<std::ffi::OsString> = abs
            .components()
            .filter_map(|c| match c {
                Component::Normal(n) => Some(n.to_os_string()),
                Component::ParentDir => Some("..".into()),
                _ => None,
            })
            .collect();
        let mut hops = 0;
        while let Some(c) = queue.pop_front() {
            if c == ".." {
                cur.pop();
                continue;
            }
            cur.push(c);
            if queue.is_empty() && !follow_last {
                break;
            }
            let p = self.root.join(cur.iter().collect::<PathBuf>());
            if let Some(target) = link_file_target(&p) {
                hops += 1;
                if hops > MAX_LINK_HOPS {
                    break;
                }
                cur.pop();
                if target.is_absolute() {
                    cur.clear();
                }
                let mut front: Vec<std::ffi::OsString> = target
                    .components()
                    .filter_map(|c| match c {
                        Component::Normal(n) => Some(n.to_os_string()),
                        Component::ParentDir => Some("..".into()),
                        _ => None,
                    })
                    .collect();
                front.extend(queue.drain(..));
                queue = front.into();
            }
        }
        self.root.join(cur.iter().collect::<PathBuf>())
    }

    /// True when `abs` exists (a link counts, even a dangling one in a fixture tree).
    pub fn exists(&self, abs: impl AsRef<Path>) -> bool {
        let p = self.resolve_inner(abs.as_ref(), false);
        p.symlink_metadata().is_ok()
    }

    /// The target of the link at `abs`, as written (`../../../0000:03:00.0`).
    pub fn read_link(&self, abs: impl AsRef<Path>) -> Option<PathBuf> {
        let p = self.resolve_inner(abs.as_ref(), false);
        std::fs::read_link(&p).ok().or_else(|| {
            if self.is_live() {
                None
            } else {
                link_file_target(&p)
            }
        })
    }

    /// The last component of the link target at `abs` (a driver's name from `device/driver`).
    pub fn read_link_name(&self, abs: impl AsRef<Path>) -> Option<String> {
        let t = self.read_link(abs)?;
        t.file_name().map(|n| n.to_string_lossy().into_owned())
    }

    /// Reads a file under the root as bytes.
    pub fn read(&self, abs: impl AsRef<Path>) -> io::Result<Vec<u8>> {
        std::fs::read(self.resolve(abs))
    }

    /// Reads a file under the root as UTF-8 (lossy) text.
    pub fn read_to_string(&self, abs: impl AsRef<Path>) -> io::Result<String> {
        let bytes = self.read(abs)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Reads a sysfs-style one-value file through [`clean_identifier`] (padding, NULs and edge
    /// whitespace gone): `None` when missing, unreadable or empty.
    pub fn read_trimmed(&self, abs: impl AsRef<Path>) -> Option<String> {
        clean_identifier_bytes(&self.read(abs).ok()?)
    }

    /// Reads and parses a one-value file (`mtu`, `numa_node`); `None` when missing or malformed.
    pub fn read_parsed<T: std::str::FromStr>(&self, abs: impl AsRef<Path>) -> Option<T> {
        self.read_trimmed(abs)?.parse().ok()
    }

    /// Entry names of the directory `abs`, sorted.
    pub fn list_dir(&self, abs: impl AsRef<Path>) -> io::Result<Vec<String>> {
        let mut names: Vec<String> = std::fs::read_dir(self.resolve(abs))?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        Ok(names)
    }
}

/// Firmware strings' cleaning, shared with the control plane ([`bc_protocol::hwid`]).
pub use bc_protocol::hwid::clean_identifier;

/// [`clean_identifier`] over bytes (decoded as UTF-8, invalid sequences replaced).
pub fn clean_identifier_bytes(raw: &[u8]) -> Option<String> {
    clean_identifier(&String::from_utf8_lossy(raw))
}

/// The target held by a fixture link file, when `p` is one (a small file whose content is a
/// relative path starting with `../` or `./`).
fn link_file_target(p: &Path) -> Option<PathBuf> {
    let md = std::fs::symlink_metadata(p).ok()?;
    if !md.is_file() || md.len() > MAX_LINK_FILE_BYTES || md.len() < 2 {
        return None;
    }
    let text = std::fs::read_to_string(p).ok()?;
    let t = text.trim_end_matches(['\n', '/']);
    (t.starts_with("../") || t.starts_with("./")).then(|| PathBuf::from(t))
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

    #[test]
    fn link_files_are_followed_in_a_fixture_tree() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let r = HostRoot::new(dir.path());
        std::fs::create_dir_all(r.path("/sys/devices/pci0000:00/0000:03:00.0/net/eth0"))?;
        std::fs::create_dir_all(r.path("/sys/class/net"))?;
        std::fs::write(
            r.path("/sys/devices/pci0000:00/0000:03:00.0/net/eth0/mtu"),
            "9000\n",
        )?;
        std::fs::write(
            r.path("/sys/class/net/eth0"),
            "../../devices/pci0000:00/0000:03:00.0/net/eth0/",
        )?;
        std::fs::write(
            r.path("/sys/devices/pci0000:00/0000:03:00.0/net/eth0/device"),
            "../../../0000:03:00.0",
        )?;
        assert_eq!(r.read_parsed::<u32>("/sys/class/net/eth0/mtu"), Some(9000));
        assert_eq!(
            r.read_link_name("/sys/class/net/eth0/device").as_deref(),
            Some("0000:03:00.0")
        );
        assert!(r.exists("/sys/class/net/eth0/device"));
        assert!(!r.exists("/sys/class/net/eth0/nope"));
        Ok(())
    }

    #[test]
    fn identifiers_lose_padding_nuls_and_control_characters() {
        for (raw, want) in [
            ("ZC1AB2CD    \0\0\0\0", Some("ZC1AB2CD")),
            ("\t  S6XXNA0T900001  \n", Some("S6XXNA0T900001")),
            ("\0\0AB\0C\0", Some("ABC")),
            ("7XQ2\tJ93", Some("7XQ2 J93")),
            (".       .CNFCP0022B0045.", Some(".       .CNFCP0022B0045.")),
            (" \0\t\r\n", None),
            ("", None),
        ] {
            assert_eq!(clean_identifier(raw).as_deref(), want, "{raw:?}");
        }
        assert_eq!(
            clean_identifier_bytes(b"\xff\xffSN-1\xff\x00").as_deref(),
            Some("SN-1")
        );
    }

    #[test]
    fn real_symlinks_work_too() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let r = HostRoot::new(dir.path());
        std::fs::create_dir_all(r.path("/sys/bus/pci/drivers/nvidia"))?;
        std::fs::create_dir_all(r.path("/sys/dev0"))?;
        std::os::unix::fs::symlink("../bus/pci/drivers/nvidia", r.path("/sys/dev0/driver"))?;
        assert_eq!(
            r.read_link_name("/sys/dev0/driver").as_deref(),
            Some("nvidia")
        );
        Ok(())
    }
}
