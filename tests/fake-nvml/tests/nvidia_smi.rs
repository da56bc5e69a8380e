//! The fake `nvidia-smi` binary, run as a process against a state file named by
//! `FAKE_NVML_CONFIG`. (Having an integration test also makes `cargo test --workspace` build the
//! binary, which bcd's NVML tests use.)
#![allow(clippy::unwrap_used)]

use std::process::Command;

use fake_nvml::config::{FakeConfig, FakeGpu};
use fake_nvml::state;

fn node(dir: &std::path::Path) -> std::path::PathBuf {
    let cfg = FakeConfig {
        gpus: vec![FakeGpu {
            uuid: "GPU-a".into(),
            pci_bus_id: "0000:1A:00.0".into(),
            persistence_mode: false,
            recovery_action: 1,
            ..FakeGpu::default()
        }],
        ..FakeConfig::default()
    };
    let path = dir.join("state.json");
    state::save(&path, &cfg).unwrap();
    path
}

fn smi(config: &std::path::Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_nvidia-smi"))
        .args(args)
        .env(state::CONFIG_ENV, config)
        .output()
        .unwrap()
}

#[test]
fn reset_changes_the_state_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = node(dir.path());
    let out = smi(&path, &["-r", "-i", "00000000:1A:00.0"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "GPU 00000000:1A:00.0 was successfully reset.\nAll done.\n"
    );
    let after = state::load(&path).unwrap();
    assert_eq!(
        (after.gpus[0].recovery_action, after.gpus[0].reset_count),
        (0, 1)
    );
}

#[test]
fn bad_arguments_exit_2_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = node(dir.path());
    let before = std::fs::read(&path).unwrap();
    for args in [
        &["-q"][..],
        &["-r"],
        &["-r", "-i"],
        &["-r", "-i", "0000:99:00.0"],
    ] {
        let out = smi(&path, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
    }
    assert_eq!(std::fs::read(&path).unwrap(), before);
}

#[test]
fn a_lost_gpu_cannot_be_opened_and_queries_say_so() {
    let dir = tempfile::tempdir().unwrap();
    let path = node(dir.path());
    let mut cfg = state::load(&path).unwrap();
    cfg.gpus.push(FakeGpu {
        uuid: "GPU-b".into(),
        pci_bus_id: "0000:5D:00.0".into(),
        lost: true,
        ..FakeGpu::default()
    });
    state::save(&path, &cfg).unwrap();
    let out = smi(
        &path,
        &["--query-gpu=index,pci.bus_id", "--format=csv,noheader"],
    );
    assert_eq!(out.status.code(), Some(15), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(
            "Unable to determine the device handle for GPU1: 0000:5D:00.0: GPU is lost. Reboot the system to recover this GPU"
        ),
        "{text}"
    );
    assert!(text.starts_with("0, 00000000:1A:00.0\n"), "{text}");
    let out = smi(&path, &["-L"]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-a)")
    );
    let out = smi(&path, &["-r", "-i", "GPU-b"]);
    assert_eq!(out.status.code(), Some(15), "{out:?}");
}
