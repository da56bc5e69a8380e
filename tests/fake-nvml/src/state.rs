//! Where the fake's JSON file is, and reading and writing it.
//!
//! Lookup order: `fake-nvml.json` beside the loaded library (for the library) or beside the
//! running executable (for the fake `nvidia-smi`), then the file `FAKE_NVML_CONFIG` names. The
//! sibling file comes first so that tests running in parallel in one process each copy the
//! library into their own directory with their own config, without touching the process
//! environment.

use std::path::{Path, PathBuf};

use crate::config::FakeConfig;

/// The file name looked for beside the library or executable.
pub const SIBLING_CONFIG: &str = "fake-nvml.json";
/// The environment variable naming the config file.
pub const CONFIG_ENV: &str = "FAKE_NVML_CONFIG";

/// What went wrong with the config file.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// No config: neither a sibling `fake-nvml.json` nor `FAKE_NVML_CONFIG`.
    #[error("no fake NVML config: no {SIBLING_CONFIG} beside {0} and {CONFIG_ENV} is not set")]
    NoConfig(String),
    /// The file could not be read or written.
    #[error("fake NVML config {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The file is not a valid config.
    #[error("fake NVML config {path}: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// The error.
        source: serde_json::Error,
    },
}

/// The config path for code running in the process image at `image` (a library or executable).
pub fn config_path_beside(image: Option<&Path>) -> Result<PathBuf, StateError> {
    if let Some(dir) = image.and_then(Path::parent) {
        let sibling = dir.join(SIBLING_CONFIG);
        if sibling.is_file() {
            return Ok(sibling);
        }
    }
    std::env::var_os(CONFIG_ENV)
        .map(PathBuf::from)
        .ok_or_else(|| {
            StateError::NoConfig(
                image
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|| "(unknown image)".into()),
            )
        })
}

/// The file that holds the code at `addr`, from `/proc/self/maps` (Linux only). This is how the
/// library finds itself without `dladdr`.
pub fn image_containing(addr: usize) -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines().find_map(|line| {
        let mut cols = line.split_whitespace();
        let range = cols.next()?;
        let (lo, hi) = range.split_once('-')?;
        let lo = usize::from_str_radix(lo, 16).ok()?;
        let hi = usize::from_str_radix(hi, 16).ok()?;
        let path = cols.nth(4)?;
        (lo <= addr && addr < hi && path.starts_with('/')).then(|| PathBuf::from(path))
    })
}

/// Reads the config.
pub fn load(path: &Path) -> Result<FakeConfig, StateError> {
    let bytes = std::fs::read(path).map_err(|source| StateError::Io {
        path: path.to_owned(),
        source,
    })?;
    serde_json::from_slice(&bytes).map_err(|source| StateError::Json {
        path: path.to_owned(),
        source,
    })
}

/// Writes the config atomically (temp file beside it, then rename), so a reader in another
/// process never sees half a file.
///
/// Not `bc_sys::atomic::write`, on purpose: this crate is a cdylib that nvml-wrapper unloads
/// (`dlclose`), and that helper names its temp file through `tempfile`, whose random name touches
/// `std::thread::current()`; the copy of std inside this library then registers a thread-exit
/// destructor that outlives the library, and the thread crashes when it ends. Code here must not
/// leave thread-local destructors behind.
pub fn save(path: &Path, cfg: &FakeConfig) -> Result<(), StateError> {
    let io = |source| StateError::Io {
        path: path.to_owned(),
        source,
    };
    let json = serde_json::to_vec_pretty(cfg).map_err(|source| StateError::Json {
        path: path.to_owned(),
        source,
    })?;
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::write(&tmp, json).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// Loads, changes and saves the config under an exclusive `flock` on `<path>.lock`, so writers in
/// different processes (the library, the fake `nvidia-smi`) never lose each other's updates.
pub fn update<T>(path: &Path, f: impl FnOnce(&mut FakeConfig) -> T) -> Result<T, StateError> {
    use nix::fcntl::{Flock, FlockArg};
    let lock_path = path.with_extension("lock");
    let io = |source| StateError::Io {
        path: lock_path.clone(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(io)?;
    let _guard = Flock::lock(file, FlockArg::LockExclusive)
        .map_err(|(_, errno)| io(std::io::Error::from(errno)))?;
    let mut cfg = load(path)?;
    let out = f(&mut cfg);
    save(path, &cfg)?;
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::config::FakeGpu;

    #[test]
    fn save_then_load_round_trips_and_sibling_wins() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(SIBLING_CONFIG);
        let cfg = FakeConfig {
            gpus: vec![FakeGpu {
                uuid: "GPU-1".into(),
                ..FakeGpu::default()
            }],
            ..FakeConfig::default()
        };
        save(&path, &cfg).unwrap();
        assert_eq!(load(&path).unwrap(), cfg);
        let image = dir.path().join("libfake_nvml.so");
        assert_eq!(config_path_beside(Some(&image)).unwrap(), path);
    }

    #[test]
    fn this_test_binary_is_found_in_proc_maps() {
        let f: fn(usize) -> Option<PathBuf> = image_containing;
        let found = image_containing(f as usize).unwrap();
        assert_eq!(found, std::env::current_exe().unwrap());
    }
}
