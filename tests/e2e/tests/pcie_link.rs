//! Issue 20.3 end to end: an agent whose host root (the QEMU q35 sysfs capture of
//! `probes/tests/fixtures/qemu-q35-topology`, with one NVMe controller's `max_link_width` raised
//! from 1 to 4 so that its x1 link is below what both ends support) joins a pool created with
//! `bcctl pools create --pcie-link-degraded noSchedule`: the node gets `PcieLinkDegraded` `true`
//! naming the device and the two widths, and the reason in `noScheduleReasons`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use bc_e2e::{Agent, ControlPlane, eventually};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(30);

/// Copies `from` to `to`, symbolic links as links.
fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let (src, dst) = (e.path(), to.join(e.file_name()));
        let t = e.file_type()?;
        if t.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&src)?, &dst)?;
        } else if t.is_dir() {
            copy_tree(&src, &dst)?;
        } else {
            std::fs::copy(&src, &dst)?;
        }
    }
    Ok(())
}

#[test]
fn a_degraded_link_in_a_no_schedule_pool_keeps_work_off_the_node() {
    let tmp = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&tmp.path().join("cp"));
    let (ok, out, err) = cp.bcctl(&[
        "pools",
        "create",
        "--name",
        "strict",
        "--kind",
        "vps-host",
        "--pcie-link-degraded",
        "noSchedule",
        "-o",
        "json",
    ]);
    assert!(ok, "{err}");
    let pool: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(pool["hardwareProfile"]["pcieLinkDegraded"], "noSchedule");
    let token = cp.create_token(&["--pool", pool["id"].as_str().unwrap()]);
    let root = tmp.path().join("root");
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../probes/tests/fixtures/qemu-q35-topology");
    copy_tree(&fixture, &root).unwrap();
    // The NVMe controller below root port 00:10.0 (x32): trained at x1, able to do x4.
    let nvme = root.join("sys/devices/pci0000:00/0000:00:10.0/0000:01:00.0");
    assert_eq!(
        std::fs::read_to_string(nvme.join("current_link_width"))
            .unwrap()
            .trim(),
        "1"
    );
    std::fs::write(nvme.join("max_link_width"), "4\n").unwrap();
    let agent = Agent::start(
        &cp,
        &tmp.path().join("agent"),
        Some(&token),
        &["--root", root.to_str().unwrap()],
    );
    let id = agent.node_id();
    let n = eventually(WAIT, "PcieLinkDegraded true", || {
        let n = cp.node(&id);
        let found = n["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == "PcieLinkDegraded"))
            .is_some_and(|c| c["status"] == "true");
        found.then_some(n)
    });
    let c = n["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "PcieLinkDegraded"))
        .unwrap();
    assert_eq!(c["reason"], "LinkDegraded", "{c}");
    assert_eq!(c["owner"], "Inventory", "{c}");
    let message = c["message"].as_str().unwrap();
    assert!(
        message.contains("0000:01:00.0 (NVMe): width x1 of x4"),
        "{message}\n{}",
        agent.log_text()
    );
    assert!(
        n["noScheduleReasons"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r == "PcieLinkDegraded"),
        "{n}"
    );
}
