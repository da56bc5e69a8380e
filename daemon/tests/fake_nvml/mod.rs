//! Test helper: a node of fake GPUs built from NVIDIA's mock H100 profile
//! (`shared/fixtures/gpus/h100.yaml`), served by `tests/fake-nvml`'s library and `nvidia-smi`.
//!
//! Every [`FakeNode`] lives in its own directory under the target dir, holding a copy of the
//! library (so each test has its own loaded instance), a hard link to the fake `nvidia-smi`, the
//! state file `fake-nvml.json` both read, and a host root with `dev/kmsg`.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::SystemTime;

pub mod field;

use bcd_probes::hostroot::HostRoot;
use bcd_probes::nvml::NvmlConfig;
use serde_json::{Value, json};

const GPUS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures/gpus");
const H100: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../shared/fixtures/gpus/h100.yaml"
);
/// Every profile in the fixture folder.
pub const PROFILES: [&str; 6] = ["a100", "b200", "gb200", "h100", "l40s", "t4"];
const FAKE_SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fake-nvml");

/// `true` when the fixture exists; otherwise prints why the test is skipped, and fails under
/// `CI=true`.
pub fn fixture_present() -> bool {
    if Path::new(H100).is_file() {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "fixture missing: {H100}"
    );
    eprintln!("!!! fixture missing: {H100}; skipping this test");
    false
}

/// `target/` (the parent of the profile dir holding this test binary).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/debug/deps/nvml_fake-<hash>
    exe.parent()
        .unwrap()
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_owned()
}

fn newest_source_mtime(dir: &Path) -> SystemTime {
    let mut newest = SystemTime::UNIX_EPOCH;
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        let t = if p.is_dir() {
            newest_source_mtime(&p)
        } else {
            e.metadata().unwrap().modified().unwrap()
        };
        newest = newest.max(t);
    }
    newest
}

/// The built fake library and `nvidia-smi`: those `cargo test --workspace` (or `cargo build`) left
/// in the profile dir when they are newer than the fake's sources, otherwise a build of `fake-nvml` into its
/// own target dir (so it never waits on the lock of the running cargo).
fn artifacts() -> &'static (PathBuf, PathBuf) {
    static BUILT: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    BUILT.get_or_init(|| {
        let target = target_dir();
        let profile = std::env::current_exe()
            .unwrap()
            .parent()
            .unwrap()
            .parent()
            .unwrap()
            .to_owned();
        let src = newest_source_mtime(&Path::new(FAKE_SRC).join("src")).max(
            std::fs::metadata(Path::new(FAKE_SRC).join("Cargo.toml"))
                .and_then(|m| m.modified())
                .unwrap_or(SystemTime::UNIX_EPOCH),
        );
        let fresh = |p: &Path| {
            std::fs::metadata(p)
                .and_then(|m| m.modified())
                .is_ok_and(|t| t >= src)
        };
        // `cargo build` uplifts the cdylib into the profile dir; `cargo test` leaves it in deps/.
        let lib = [
            profile.join("libfake_nvml.so"),
            profile.join("deps/libfake_nvml.so"),
        ]
        .into_iter()
        .find(|p| fresh(p));
        let smi = profile.join("nvidia-smi");
        if let Some(lib) = lib
            && fresh(&smi)
        {
            return (lib, smi);
        }
        let own = target.join("fake-nvml-for-tests");
        let status = bc_e2e::cargo_command()
            .args(["build", "-p", "fake-nvml", "--target-dir"])
            .arg(&own)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("run cargo build -p fake-nvml");
        assert!(status.success(), "cargo build -p fake-nvml failed");
        (
            own.join("debug/libfake_nvml.so"),
            own.join("debug/nvidia-smi"),
        )
    })
}

/// A node of fake GPUs.
pub struct FakeNode {
    _dir: tempfile::TempDir,
    pub dir: PathBuf,
    pub state: PathBuf,
    pub cfg: NvmlConfig,
    pub root: HostRoot,
}

impl FakeNode {
    /// A fake node described by `config` (the fake's JSON).
    pub fn new(config: &Value) -> Self {
        let (lib, smi) = artifacts();
        let base = target_dir().join("fake-nvml-nodes");
        std::fs::create_dir_all(&base).unwrap();
        let dir = tempfile::tempdir_in(&base).unwrap();
        let d = dir.path().to_owned();
        std::fs::copy(lib, d.join("libfake_nvml.so")).unwrap();
        // A hard link, not a copy: writing an executable races with fork+exec in other test
        // threads (ETXTBSY); `current_exe()` of a hard link still names this directory.
        if std::fs::hard_link(smi, d.join("nvidia-smi")).is_err() {
            std::fs::copy(smi, d.join("nvidia-smi")).unwrap();
        }
        let state = d.join("fake-nvml.json");
        std::fs::write(&state, serde_json::to_vec_pretty(config).unwrap()).unwrap();
        std::fs::create_dir_all(d.join("root/dev")).unwrap();
        std::fs::write(d.join("root/dev/kmsg"), "").unwrap();
        Self {
            cfg: NvmlConfig {
                lib_path: Some(d.join("libfake_nvml.so")),
                nvidia_smi: d.join("nvidia-smi"),
            },
            root: HostRoot::new(d.join("root")),
            state,
            dir: d,
            _dir: dir,
        }
    }

    /// The current state.
    pub fn read(&self) -> Value {
        serde_json::from_slice(&std::fs::read(&self.state).unwrap()).unwrap()
    }

    /// Changes the state, under the fake's `flock` on `fake-nvml.lock` (the library writes the
    /// file too, e.g. when a process initializes NVML).
    pub fn update(&self, f: impl FnOnce(&mut Value)) {
        use nix::fcntl::{Flock, FlockArg};
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.state.with_extension("lock"))
            .unwrap();
        let _guard = Flock::lock(lock, FlockArg::LockExclusive).unwrap();
        let mut v = self.read();
        f(&mut v);
        bc_sys::atomic::write(&self.state, &serde_json::to_vec_pretty(&v).unwrap(), 0o644).unwrap();
    }

    /// Appends kernel log records (in `/dev/kmsg` form) to the host root's `dev/kmsg`.
    pub fn kmsg(&self, lines: &[&str]) {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(self.root.path("/dev/kmsg"))
            .unwrap();
        for l in lines {
            writeln!(f, "{l}").unwrap();
        }
    }
}

fn y<'a>(v: &'a serde_norway::Value, path: &[&str]) -> &'a serde_norway::Value {
    path.iter().fold(v, |v, k| &v[*k])
}

fn yu(v: &serde_norway::Value, path: &[&str]) -> u64 {
    y(v, path)
        .as_u64()
        .unwrap_or_else(|| panic!("{path:?} not a number"))
}

fn ys(v: &serde_norway::Value, path: &[&str]) -> String {
    y(v, path)
        .as_str()
        .unwrap_or_else(|| panic!("{path:?} not a string"))
        .to_owned()
}

/// The fake's JSON for the HGX H100 profile: eight GPUs with their UUIDs, serials and bus ids,
/// 18 active NVLink links each fanned over the four NVSwitches, and the profile's memory, PCIe,
/// power and thermal values.
pub fn h100_node() -> Value {
    profile_node("h100")
}

/// The fake's JSON for one of NVIDIA's mock profiles (`a100`, `h100`, `l40s`, ...): the listed
/// devices with the defaults' values; NVLink links fanned round-robin over the declared
/// NVSwitches (none when the profile declares no switches).
pub fn profile_node(profile: &str) -> Value {
    let path = format!("{GPUS}/{profile}.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let p: serde_norway::Value = serde_norway::from_str(&text).unwrap();
    let d = y(&p, &["device_defaults"]);
    let switches: Vec<String> = y(&p, &["nvlink", "switches"])
        .as_sequence()
        .map(|sw| sw.iter().map(|s| ys(s, &["bdf"])).collect())
        .unwrap_or_default();
    let links = if switches.is_empty() {
        0
    } else {
        yu(&p, &["nvlink", "links_per_gpu"]) as usize
    };
    let opt = |path: &[&str]| y(d, path).as_u64().unwrap_or(0);
    let gpus: Vec<Value> = y(&p, &["devices"])
        .as_sequence()
        .unwrap()
        .iter()
        .map(|dev| {
            json!({
                "uuid": ys(dev, &["uuid"]),
                "name": ys(d, &["name"]),
                "serial": y(dev, &["serial"]).as_str(),
                "vbiosVersion": y(d, &["vbios_version"]).as_str(),
                "pciBusId": ys(dev, &["pci", "bus_id"]),
                "pciDeviceId": yu(d, &["pci", "device_id"]),
                "pciSubSystemId": opt(&["pci", "subsystem_id"]),
                "memoryTotalBytes": yu(d, &["memory", "total_bytes"]),
                "memoryReservedBytes": opt(&["memory", "reserved_bytes"]),
                "memoryUsedBytes": opt(&["memory", "used_bytes"]),
                "temperatureC": yu(d, &["thermal", "temperature_gpu_c"]),
                "slowdownThresholdC": yu(d, &["thermal", "slowdown_threshold_c"]),
                "shutdownThresholdC": yu(d, &["thermal", "shutdown_threshold_c"]),
                "powerUsageMw": yu(d, &["power", "current_draw_mw"]),
                "powerLimitMw": yu(d, &["power", "enforced_limit_mw"]),
                "pcie": {
                    "currentGen": yu(d, &["pcie", "current_link_gen"]),
                    "maxGen": yu(d, &["pcie", "max_link_gen"]),
                    "currentWidth": yu(d, &["pcie", "current_link_width"]),
                    "maxWidth": yu(d, &["pcie", "max_link_width"]),
                },
                "nvlinks": (0..links).map(|l| json!({
                    "active": true,
                    "remotePciBusId": switches[l % switches.len()],
                })).collect::<Vec<_>>(),
                "persistenceMode": ys(d, &["persistence_mode"]) == "enabled",
                "throttleReasons": 0,
                "fabric": fabric(d),
            })
        })
        .collect();
    let sys = y(&p, &["system"]);
    json!({
        "driverVersion": ys(sys, &["driver_version"]),
        "nvmlVersion": ys(sys, &["nvml_version"]),
        "cudaDriverVersion": yu(sys, &["cuda_version_major"]) * 1000
            + yu(sys, &["cuda_version_minor"]) * 10,
        "gpus": gpus,
    })
}

/// The fake's `fabric` of a profile's `device_defaults.fabric` (Hopper and later on NVSwitch
/// systems); `state: auto` is a fabric manager that registered the GPU (`completed`). Null where
/// the profile declares none (A100, PCIe cards): `NOT_SUPPORTED`.
fn fabric(defaults: &serde_norway::Value) -> Value {
    let f = y(defaults, &["fabric"]);
    if f.is_null() {
        return Value::Null;
    }
    let state = match f["state"].as_str() {
        Some("auto") | None => "completed".to_owned(),
        Some(s) => s.to_owned(),
    };
    json!({
        "state": state,
        "cliqueId": f["clique_id"].as_u64().unwrap_or(0),
        "clusterUuid": ys(f, &["cluster_uuid"]),
    })
}

/// A kernel log record as `/dev/kmsg` returns it, for an XID on `bus` (`0000:4a:00`).
pub fn xid_record(seq: u64, bus: &str, xid: u64) -> String {
    format!(
        "3,{seq},{},-;NVRM: Xid (PCI:{bus}): {xid}, pid=0, name=python3, test",
        seq * 1000
    )
}
