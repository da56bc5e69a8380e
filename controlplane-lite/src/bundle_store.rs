//! Where `logs.collect` bundles are kept (`<state dir>/bundles`), and for how long.
//!
//! # Background
//! Bundles used to stay forever, and an upload was written until the disk was full.
//!
//! # Design
//! [`Retention`] keeps bundles by age, count and total bytes (`--bundle-max-age`,
//! `--bundle-max-count`, `--bundle-max-bytes`): [`BundleStore::prune`] deletes those older than
//! the age, then the oldest until both the count and the total fit. It runs before an upload,
//! after one is stored (the new bundle is never the one deleted), and every
//! [`PRUNE_PERIOD`]. An upload is refused with a clear error ([`RoomError`], the gateway answers
//! `RESOURCE_EXHAUSTED`) when the bundle alone is over `--bundle-max-bytes`, or when writing its
//! next chunk would leave less than `--bundle-min-free-bytes` free on the file system: the store
//! never fills the disk. The directory is 0700 and every bundle 0600, whatever the umask. A
//! bundle's digest file ([`digest_path`], the SHA-256 the gateway computed) goes with it.
//!
//! # Limitations
//! Age is the file's modification time (when its upload finished). Free space is read with
//! `statvfs` before each chunk; another writer on the same file system can still use the space
//! between two chunks.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// How often `bcctl serve` prunes by age besides the uploads.
pub const PRUNE_PERIOD: Duration = Duration::from_secs(600);

/// What is kept. Defaults: 7 days, 1,000 bundles, 10 GiB, and 1 GiB left free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Bundles older than this are deleted (`--bundle-max-age`).
    pub max_age: Duration,
    /// At most this many bundles are kept, the newest (`--bundle-max-count`).
    pub max_count: usize,
    /// At most this many bytes of bundles are kept, the newest; one bundle larger than this is
    /// refused (`--bundle-max-bytes`).
    pub max_bytes: u64,
    /// An upload stops before it would leave less free space than this on the bundles' file
    /// system (`--bundle-min-free-bytes`).
    pub min_free_bytes: u64,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            max_age: Duration::from_secs(7 * 24 * 3600),
            max_count: 1000,
            max_bytes: 10 * 1024 * 1024 * 1024,
            min_free_bytes: 1024 * 1024 * 1024,
        }
    }
}

/// Why an upload cannot take more room.
#[derive(Debug, thiserror::Error)]
pub enum RoomError {
    /// The bundle alone is over the store's byte limit.
    #[error(
        "bundle of {bytes} bytes is over the bundle store's limit of {max} bytes (--bundle-max-bytes)"
    )]
    TooLarge { bytes: u64, max: u64 },
    /// Writing on would leave less free space than the store keeps.
    #[error(
        "not enough free space for the bundle in {dir}: {free} bytes free, {needed} more needed, at least {keep} kept free (--bundle-min-free-bytes)"
    )]
    DiskFull {
        dir: PathBuf,
        free: u64,
        needed: u64,
        keep: u64,
    },
    /// The free space could not be read.
    #[error("reading the free space of {dir}: {source}")]
    Statvfs { dir: PathBuf, source: nix::Error },
}

/// The file holding the SHA-256 (lowercase hex) the gateway computed for the bundle at `bundle`
/// (`<command id>.tar.gz.sha256`).
pub fn digest_path(bundle: &Path) -> PathBuf {
    let mut name = bundle.as_os_str().to_owned();
    name.push(".sha256");
    PathBuf::from(name)
}

/// What a prune did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    /// Bundles deleted.
    pub deleted: usize,
    /// Bytes freed.
    pub freed_bytes: u64,
    /// Bundles kept.
    pub kept: usize,
    /// Bytes of the bundles kept.
    pub kept_bytes: u64,
}

/// The bundles directory under its retention rules.
#[derive(Debug, Clone)]
pub struct BundleStore {
    dir: PathBuf,
    retention: Retention,
}

/// A stored bundle as the prune sees it.
#[derive(Debug)]
struct Entry {
    path: PathBuf,
    modified: SystemTime,
    bytes: u64,
}

impl BundleStore {
    /// The store in `dir` (created on first use) under `retention`.
    pub fn new(dir: PathBuf, retention: Retention) -> Self {
        Self { dir, retention }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The rules.
    pub fn retention(&self) -> Retention {
        self.retention
    }

    /// Creates the directory 0700 when it is missing and makes it 0700 when it is not.
    pub fn ensure_dir(&self) -> io::Result<()> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)?;
        fs::set_permissions(&self.dir, fs::Permissions::from_mode(0o700))
    }

    /// Creates (truncating) a file in the store, 0600 whatever the umask.
    pub fn create_file(&self, path: &Path) -> io::Result<fs::File> {
        let f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)?;
        f.set_permissions(fs::Permissions::from_mode(0o600))?;
        Ok(f)
    }

    /// Creates a temp file of its own in the store (`prefix`, a random part, `suffix`), 0600
    /// whatever the umask, deleted when dropped unless it is persisted.
    pub fn create_temp(&self, prefix: &str, suffix: &str) -> io::Result<tempfile::NamedTempFile> {
        let f = tempfile::Builder::new()
            .prefix(prefix)
            .suffix(suffix)
            .permissions(fs::Permissions::from_mode(0o600))
            .tempfile_in(&self.dir)?;
        f.as_file()
            .set_permissions(fs::Permissions::from_mode(0o600))?;
        Ok(f)
    }

    /// Whether an upload that has `written` bytes may write `next` more: refused when the bundle
    /// would be over `max_bytes`, or the file system would keep less than `min_free_bytes` free.
    pub fn room_for(&self, written: u64, next: u64) -> Result<(), RoomError> {
        let bytes = written.saturating_add(next);
        if bytes > self.retention.max_bytes {
            return Err(RoomError::TooLarge {
                bytes,
                max: self.retention.max_bytes,
            });
        }
        let st = nix::sys::statvfs::statvfs(&self.dir).map_err(|source| RoomError::Statvfs {
            dir: self.dir.clone(),
            source,
        })?;
        // Widened: the field types differ between platforms.
        #[allow(clippy::useless_conversion)]
        let free = u64::from(st.blocks_available()).saturating_mul(u64::from(st.fragment_size()));
        if free < next.saturating_add(self.retention.min_free_bytes) {
            return Err(RoomError::DiskFull {
                dir: self.dir.clone(),
                free,
                needed: next,
                keep: self.retention.min_free_bytes,
            });
        }
        Ok(())
    }

    /// Deletes bundles (`*.tar.gz`) older than `max_age`, then the oldest until at most
    /// `max_count` and `max_bytes` remain; `keep` (a bundle just stored) is never deleted.
    /// A deleted bundle's digest file goes first (a digest without its bundle would make a
    /// download or a repeated upload believe the bundle is still there). Unfinished uploads
    /// (`*.part`) are left to their upload. A missing directory is empty.
    pub fn prune(&self, now: SystemTime, keep: Option<&Path>) -> io::Result<Pruned> {
        let mut entries = match self.entries() {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Pruned::default()),
            Err(e) => return Err(e),
        };
        // Newest first: what is kept is a prefix.
        entries.sort_by(|a, b| b.modified.cmp(&a.modified).then(a.path.cmp(&b.path)));
        let mut out = Pruned::default();
        for e in entries {
            let pinned = keep == Some(e.path.as_path());
            let too_old = now
                .duration_since(e.modified)
                .is_ok_and(|age| age > self.retention.max_age);
            let over = out.kept >= self.retention.max_count
                || out.kept_bytes.saturating_add(e.bytes) > self.retention.max_bytes;
            if pinned || !(too_old || over) {
                out.kept += 1;
                out.kept_bytes = out.kept_bytes.saturating_add(e.bytes);
                continue;
            }
            match fs::remove_file(digest_path(&e.path)) {
                Ok(()) => {}
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(err) => return Err(err),
            }
            match fs::remove_file(&e.path) {
                Ok(()) => {
                    out.deleted += 1;
                    out.freed_bytes = out.freed_bytes.saturating_add(e.bytes);
                }
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(err) => return Err(err),
            }
        }
        Ok(out)
    }

    fn entries(&self) -> io::Result<Vec<Entry>> {
        let mut out = Vec::new();
        for e in fs::read_dir(&self.dir)? {
            let e = e?;
            let path = e.path();
            let is_bundle = path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(".tar.gz"));
            let meta = e.metadata()?;
            if !is_bundle || !meta.is_file() {
                continue;
            }
            out.push(Entry {
                path,
                modified: meta.modified()?,
                bytes: meta.len(),
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundle(dir: &Path, name: &str, bytes: usize, age: Duration) -> io::Result<PathBuf> {
        let p = dir.join(format!("{name}.tar.gz"));
        fs::write(&p, vec![0u8; bytes])?;
        let f = fs::OpenOptions::new().write(true).open(&p)?;
        f.set_modified(SystemTime::now() - age)?;
        Ok(p)
    }

    fn names(dir: &Path) -> io::Result<Vec<String>> {
        let mut v: Vec<String> = fs::read_dir(dir)?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        Ok(v)
    }

    fn store(dir: &Path, r: Retention) -> BundleStore {
        BundleStore::new(dir.to_owned(), r)
    }

    #[test]
    fn bundles_are_kept_by_age_count_and_bytes() -> io::Result<()> {
        let d = tempfile::tempdir()?;
        let min = Duration::from_secs(60);
        bundle(d.path(), "old", 10, Duration::from_secs(8 * 24 * 3600))?;
        bundle(d.path(), "a", 100, 4 * min)?;
        bundle(d.path(), "b", 100, 3 * min)?;
        let c = bundle(d.path(), "c", 100, 2 * min)?;
        let newest = bundle(d.path(), "d", 100, min)?;
        fs::write(d.path().join("e.tar.gz.part"), b"uploading")?;
        let r = Retention::default();
        // Age: the 8-day-old one goes.
        let p = store(d.path(), r).prune(SystemTime::now(), None)?;
        assert_eq!((p.deleted, p.kept, p.kept_bytes), (1, 4, 400));
        // Count: the oldest go first; the pinned one stays whatever its age.
        let p = store(d.path(), Retention { max_count: 3, ..r }).prune(SystemTime::now(), None)?;
        assert_eq!((p.deleted, p.freed_bytes), (1, 100));
        assert_eq!(
            names(d.path())?,
            ["b.tar.gz", "c.tar.gz", "d.tar.gz", "e.tar.gz.part"]
        );
        // Bytes: 250 allow two of 100.
        let p = store(
            d.path(),
            Retention {
                max_bytes: 250,
                ..r
            },
        )
        .prune(SystemTime::now(), None)?;
        assert_eq!((p.deleted, p.kept), (1, 2));
        assert_eq!(names(d.path())?, ["c.tar.gz", "d.tar.gz", "e.tar.gz.part"]);
        // A bundle's digest file goes with it; the kept one's stays.
        fs::write(digest_path(&c), b"digest of c")?;
        fs::write(digest_path(&newest), b"digest of d")?;
        let p = store(d.path(), Retention { max_count: 0, ..r })
            .prune(SystemTime::now(), Some(&newest))?;
        assert_eq!((p.deleted, p.kept), (1, 1));
        assert_eq!(
            names(d.path())?,
            ["d.tar.gz", "d.tar.gz.sha256", "e.tar.gz.part"],
            "the new bundle stays"
        );
        // A missing directory is empty.
        let gone = store(&d.path().join("nowhere"), r).prune(SystemTime::now(), None)?;
        assert_eq!(gone, Pruned::default());
        Ok(())
    }

    #[test]
    fn an_upload_is_refused_before_it_fills_the_disk_or_the_store() -> io::Result<()> {
        let d = tempfile::tempdir()?;
        let r = Retention::default();
        let s = store(d.path(), r);
        assert!(s.room_for(0, 1024).is_ok());
        let big = s.room_for(r.max_bytes, 1);
        assert!(matches!(big, Err(RoomError::TooLarge { .. })), "{big:?}");
        let full = store(
            d.path(),
            Retention {
                min_free_bytes: u64::MAX / 2,
                ..r
            },
        )
        .room_for(0, 1);
        let msg = full.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            msg.contains("not enough free space") && msg.contains("--bundle-min-free-bytes"),
            "{msg}"
        );
        Ok(())
    }

    #[test]
    fn the_directory_and_the_files_are_private() -> io::Result<()> {
        let d = tempfile::tempdir()?;
        let dir = d.path().join("bundles");
        fs::DirBuilder::new().mode(0o755).create(&dir)?;
        let s = store(&dir, Retention::default());
        s.ensure_dir()?;
        assert_eq!(fs::metadata(&dir)?.permissions().mode() & 0o777, 0o700);
        let f = dir.join("x.tar.gz.part");
        drop(s.create_file(&f)?);
        assert_eq!(fs::metadata(&f)?.permissions().mode() & 0o777, 0o600);
        Ok(())
    }
}
