//! `bcctl dev --metal N` (issue 15): the control plane embedded, a real `bcd site` with its boot
//! service, sushy-emulator's BMCs and N QEMU machines booting the ramdisk image over iPXE, all
//! enrolled and followed to `ready`; and without its tools (UEFI firmware included, with
//! `--firmware uefi`), a refusal that names each one missing and how to get it, before anything
//! starts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use bc_e2e::ramdisk;
use bcd_site::test_utils::sushy::Sushy;

#[test]
fn without_its_tools_dev_metal_names_what_is_missing() {
    let (bcctl, _) = ramdisk::bins();
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(bcctl)
        .args([
            "dev",
            "--metal",
            "1",
            "--once",
            "--firmware",
            "uefi",
            "--ramdisk",
        ])
        .arg(tmp.path().join("no-image"))
        .arg("--state-dir")
        .arg(tmp.path().join("state"))
        .env_remove("BC_SUSHY_EMULATOR")
        .env_remove("BC_QEMU")
        .env("BC_OVMF_CODE", tmp.path().join("no-OVMF_CODE.fd"))
        .env("BC_OVMF_VARS", tmp.path().join("no-OVMF_VARS.fd"))
        .env("PATH", tmp.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    for what in [
        "sushy-emulator",
        "qemu-system-x86_64",
        "the ramdisk image",
        "build.sh",
        "--firmware uefi",
        "no-OVMF_CODE.fd",
        "ovmf",
    ] {
        assert!(err.contains(what), "{what} not named: {err}");
    }
    assert!(
        !tmp.path().join("state").join("controlplane").exists(),
        "nothing starts before the tools are there"
    );
}

#[test]
fn dev_metal_brings_two_machines_to_ready() {
    let Some(tools) = ramdisk::tools_or_skip("dev_metal") else {
        return;
    };
    let Some(sushy) = Sushy::program("dev_metal") else {
        return;
    };
    let (bcctl, bcd) = ramdisk::bins();
    let tmp = tempfile::tempdir().unwrap();
    let image = ramdisk::build_image(&tools, bcd, &tmp.path().join("image"));
    let out = Command::new(bcctl)
        .args([
            "dev",
            "--metal",
            "2",
            "--once",
            "--heartbeat-interval",
            "500ms",
        ])
        .arg("--ramdisk")
        .arg(image.kernel.parent().unwrap())
        .arg("--bcd")
        .arg(bcd)
        .arg("--state-dir")
        .arg(tmp.path().join("state"))
        .env("BC_SUSHY_EMULATOR", &sushy)
        .env("BC_QEMU", &tools.qemu)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "bcctl dev --metal failed:\n{stdout}\n{stderr}"
    );
    eprintln!("{stdout}");
    assert!(stdout.contains("2 machine(s) ready"), "{stdout}");
    let ready: Vec<&str> = stdout
        .lines()
        .filter(|l| l.trim_start().starts_with("node_") && l.contains(" ready "))
        .collect();
    assert_eq!(ready.len(), 2, "{stdout}");
    for (line, serial) in ready.iter().zip(["DEV-METAL-0001", "DEV-METAL-0002"]) {
        assert!(
            line.contains("power off") && line.contains(serial),
            "{line}"
        );
    }
    assert!(stdout.trim_end().ends_with("stopped"), "{stdout}");
}
