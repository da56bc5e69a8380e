//! Bare-metal workflows booted for real (issue 16), on the rig of `metal_vm.rs`: sushy-emulator's
//! Redfish BMCs, a real `bcd site` with its boot service, QEMU machines PXE-booting the ramdisk
//! built by `packaging/ramdisk/build.sh`, and a real `bcctl serve`.
//! - Machine x runs "its own OS": a disk with a GPT and a tenant's data. Enrolled with
//!   `--deployed` it is `deployed` without a boot; `nodes release` boots the ramdisk, which
//!   erases the metadata of every disk → `ready`, powered off; the harness reads the VM's disk:
//!   both GPT headers and the partitions' first MiB are zero, the data in the middle is still
//!   there (metadata mode). `nodes retire` cleans again → `retired`, powered off, not
//!   schedulable, its identity ended.
//! - Machine w is inspected to `ready`, then deployed with a raw image the test makes (a GPT and
//!   a marker) and serves over HTTP (Python's `http.server`): a wrong SHA-256 → `failed`
//!   (`ChecksumMismatch`), the disk's first MiB not the image's; the machine ignoring its
//!   power-on → the pool's deploy deadline fails it; `nodes recover` once the harness lets it
//!   boot → `deployed`: the VM's disk holds the image and a `cidata` config drive with the
//!   hostname, the key and the system's own identity (`bcd-join-token`), and the BMC boots the
//!   disk, persistently. With that identity an agent joins as w; the pool's join token, showing
//!   the same machine, is refused `BARE_METAL_NODE` (issue 30.1).
//!
//! Skipped loudly without QEMU, a kernel or sushy-emulator; a failure under `CI=true`. Times are
//! printed (docs/benchmarks.md), never asserted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/metal.rs"]
mod metal;
#[path = "support/bare_metal.rs"]
mod support;

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use bc_e2e::{ControlPlane, eventually, ramdisk};
use bc_metal_sim::machines::{Happened, Machines};
use bc_protocol::pb::AgentMode;
use bcd_site::test_utils::free_tcp_port;
use bcd_site::test_utils::sushy::Sushy;
use metal::{enroll_with, machine, moves, system, until_state};
use serde_json::json;
use support::{Seen, WAIT, condition};

const MIB: u64 = 1 << 20;
/// Written in the middle of the tenant's data partition: metadata erase leaves it.
const TENANT_DATA: &[u8] = b"BCD-TENANT-DATA-IN-THE-MIDDLE";

/// Bytes of `file` at `offset`.
fn read_at(file: &Path, offset: u64, len: usize) -> Vec<u8> {
    let mut f = std::fs::File::open(file).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    let mut buf = vec![0u8; len];
    f.read_exact(&mut buf).unwrap();
    buf
}

fn write_at(file: &Path, offset: u64, data: &[u8]) {
    use std::io::Write as _;
    let mut f = std::fs::OpenOptions::new().write(true).open(file).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.write_all(data).unwrap();
}

/// A `size`-byte file with a GPT (sfdisk, from util-linux) of two partitions: 8 MiB from 1 MiB,
/// and the rest.
fn gpt_disk(file: &Path, size: u64) {
    std::fs::File::create(file).unwrap().set_len(size).unwrap();
    let mut sf = Command::new("sfdisk")
        .args(["--quiet", "--no-reread", "--no-tell-kernel"])
        .arg(file)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("sfdisk (util-linux's fdisk package)");
    use std::io::Write as _;
    sf.stdin
        .take()
        .unwrap()
        .write_all(b"label: gpt\nstart=2048, size=16384\nstart=18432\n")
        .unwrap();
    assert!(sf.wait().unwrap().success(), "sfdisk on {}", file.display());
}

fn zero(b: &[u8]) -> bool {
    b.iter().all(|x| *x == 0)
}

fn steps(seen: &mut Seen, cp: &ControlPlane, id: &str, kind: &str) -> Vec<String> {
    seen.events(cp, id)
        .iter()
        .filter(|e| e["kind"] == kind)
        .map(|e| {
            format!(
                "{} {}",
                e["to"].as_str().unwrap_or(""),
                e["message"].as_str().unwrap_or("")
            )
        })
        .collect()
}

#[test]
fn machines_are_released_retired_and_deployed_under_qemu() {
    let Some(tools) = ramdisk::tools_or_skip("metal_workflows") else {
        return;
    };
    let x = machine("x", 11, "SER-X-0011", false);
    let w = machine("w", 12, "SER-W-0012", false);
    let systems = [system(&x, "SER-X-0011"), system(&w, "SER-W-0012")];
    let (_, bcd) = ramdisk::bins();
    let tmp = tempfile::tempdir().unwrap();
    let image = ramdisk::build_image(&tools, bcd, &tmp.path().join("image"));
    // Machine x's disk holds "its OS": a GPT, and the tenant's data in the middle.
    let x_disk = Machines::disk(tmp.path(), &x.name);
    gpt_disk(&x_disk, 64 * MIB);
    write_at(&x_disk, 2 * MIB, b"ext4-superblock-stand-in");
    write_at(&x_disk, 30 * MIB, TENANT_DATA);
    let mut seen = Seen::default();
    let Some(rig) = metal::Rig::start(
        "metal_workflows",
        tmp.path(),
        &tools,
        &image,
        vec![x.clone(), w.clone()],
        &systems,
        &mut seen,
    ) else {
        return;
    };
    let (cp, sushy, site) = (&rig.cp, &rig.sushy, rig.site.clone());
    let p = seen.bcctl(
        cp,
        &[
            "pools",
            "create",
            "--name",
            "metal",
            "--kind",
            "metal-host",
            "--site",
            &site,
            "--cleaning",
            "metadata",
            "--cleaning-deadline",
            "15m",
        ],
        None,
    );
    assert_eq!(p["acceptance"]["cleaning"], "metadata", "{p:#}");
    assert_eq!(p["acceptance"]["cleaningDeadlineSeconds"], 900, "{p:#}");
    let pool = p["id"].as_str().unwrap().to_owned();
    // Machine x: adopted as deployed (no boot), released, retired.
    let x_id = enroll_with(
        &mut seen,
        cp,
        &site,
        &pool,
        "x",
        &sushy.address(&x.uuid),
        &["--deployed"],
    );
    let n = until_state(&mut seen, cp, &x_id, "deployed", &rig.dump(&x.uuid));
    assert_eq!(moves(&mut seen, cp, &x_id), ["enrolling", "deployed"]);
    assert!(
        !rig.machines
            .happened()
            .iter()
            .any(|(_, h)| *h == Happened::Started(x.uuid.clone())),
        "a machine enrolled as deployed is never booted"
    );
    let generation = n["identityGeneration"].as_u64().unwrap();
    let started = Instant::now();
    let v = seen.bcctl(cp, &["nodes", "release", &x_id], None);
    assert_eq!(v["provisionState"], "releasing", "{v:#}");
    assert!(
        v["identityGeneration"].as_u64().unwrap() > generation,
        "{v:#}"
    );
    let n = until_state(&mut seen, cp, &x_id, "ready", &rig.dump(&x.uuid));
    let released_in = started.elapsed();
    let cleaned = condition(&n, "Cleaned").unwrap();
    assert_eq!(cleaned["status"], "true", "{n:#}");
    let clean_steps = steps(&mut seen, cp, &x_id, "cleaningStep");
    let disk_step = clean_steps
        .iter()
        .find(|s| s.starts_with("cleaned nvme0n1"))
        .unwrap_or_else(|| panic!("no cleaned nvme0n1: {clean_steps:#?}"));
    assert!(disk_step.contains("serial NVME-x"), "{disk_step}");
    assert_eq!(
        moves(&mut seen, cp, &x_id),
        ["enrolling", "deployed", "releasing", "ready"]
    );
    rig.until_off(&x.uuid);
    // The VM is off: its disk is the harness's to read.
    assert!(
        zero(&read_at(&x_disk, 0, MIB as usize)),
        "protective MBR and primary GPT"
    );
    assert!(
        zero(&read_at(&x_disk, 63 * MIB, MIB as usize)),
        "backup GPT at the disk's end"
    );
    assert!(
        zero(&read_at(&x_disk, MIB, MIB as usize)),
        "partition 1's first MiB"
    );
    assert!(
        zero(&read_at(&x_disk, 9 * MIB, MIB as usize)),
        "partition 2's first MiB"
    );
    assert_eq!(
        read_at(&x_disk, 30 * MIB, TENANT_DATA.len()),
        TENANT_DATA,
        "metadata mode leaves the middle of the disk"
    );
    eprintln!(
        "metal_workflows: release of x (deployed -> ready, one TCG boot, metadata clean): {:.1} s; {disk_step}",
        released_in.as_secs_f64()
    );

    let before = seen.node(cp, &x_id)["identityGeneration"].as_u64().unwrap();
    let v = seen.bcctl(cp, &["nodes", "retire", &x_id], None);
    assert_eq!(v["provisionState"], "retiring", "{v:#}");
    let n = until_state(&mut seen, cp, &x_id, "retired", &rig.dump(&x.uuid));
    assert!(
        n["identityGeneration"].as_u64().unwrap() >= before + 2,
        "the retire and the retired ramdisk each ended an identity: {n:#}"
    );
    assert_eq!(n["schedulable"], false, "{n:#}");
    rig.until_off(&x.uuid);
    assert_eq!(moves(&mut seen, cp, &x_id)[4..], ["retiring", "retired"]);

    let on = DeployRig {
        rig: &rig,
        cp: &rig.cp,
        machines: &rig.machines,
        sushy: &rig.sushy,
        rt: &rig.rt,
        pool: &pool,
        dir: tmp.path(),
    };
    deploy(&mut seen, &on, &site, &w, &rig.dump(&w.uuid));
}

/// What the deploy part runs on: the rig, its parts, the pool and the machines' directory.
struct DeployRig<'a> {
    rig: &'a metal::Rig,
    cp: &'a ControlPlane,
    machines: &'a Machines,
    sushy: &'a Sushy,
    rt: &'a tokio::runtime::Runtime,
    pool: &'a str,
    dir: &'a Path,
}

/// In the deployed image's first partition.
const IMAGE_MARKER: &[u8] = b"BCD-DEPLOYED-IMAGE-MARKER";
/// A real public key (its private half was thrown away): a config drive's keys are parsed.
const SSH_KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAINkvjCvsfbt7KI7ntjeXkikvjiDQQXWDes2d9GXd3e7l e2e@metal";

/// A static file server on loopback (Python's `http.server`), killed on drop.
struct Served(std::process::Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(dir: &Path, port: u16) -> Served {
    let child = Command::new("python3")
        .args(["-m", "http.server", "--bind", "127.0.0.1"])
        .arg(port.to_string())
        .arg("--directory")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3 -m http.server");
    eventually(WAIT, "the image server", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).ok()
    });
    Served(child)
}

/// `bcctl pools update` of the rig's pool with a new deploy deadline (and its name, version).
fn set_deploy_deadline(seen: &mut Seen, rig: &DeployRig<'_>, deadline: &str) {
    let p = seen.ok(rig.cp, "pools.get", json!({"poolId": rig.pool}));
    let version = p["version"].as_u64().unwrap().to_string();
    let name = p["name"].as_str().unwrap().to_owned();
    let v = seen.bcctl(
        rig.cp,
        &[
            "pools",
            "update",
            rig.pool,
            "--version",
            &version,
            "--name",
            &name,
            "--deploy-deadline",
            deadline,
        ],
        None,
    );
    assert!(v["acceptance"]["deployDeadlineSeconds"].is_u64(), "{v:#}");
}

fn sha256_hex(file: &Path) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(std::fs::read(file).unwrap()))
}

fn deploy(
    seen: &mut Seen,
    rig: &DeployRig<'_>,
    site: &str,
    w: &bc_metal_sim::machines::Machine,
    dump: &dyn Fn() -> String,
) {
    let (cp, machines) = (rig.cp, rig.machines);
    let w_id = enroll_with(
        seen,
        cp,
        site,
        rig.pool,
        "w",
        &rig.sushy.address(&w.uuid),
        &[],
    );
    until_state(seen, cp, &w_id, "ready", dump);
    rig.rig.until_off(&w.uuid);
    let w_disk = Machines::disk(rig.dir, &w.name);
    // The image: 8 MiB with a GPT whose one partition (1 MiB from 1 MiB) holds the marker.
    let served = rig.dir.join("images");
    std::fs::create_dir_all(&served).unwrap();
    let img = served.join("disk.raw");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(8 * MIB)
        .unwrap();
    let mut sf = Command::new("sfdisk")
        .args(["--quiet", "--no-reread", "--no-tell-kernel"])
        .arg(&img)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("sfdisk");
    {
        use std::io::Write as _;
        sf.stdin
            .take()
            .unwrap()
            .write_all(b"label: gpt\nstart=2048, size=2048\n")
            .unwrap();
    }
    assert!(sf.wait().unwrap().success());
    write_at(&img, MIB + 4096, IMAGE_MARKER);
    let sha = sha256_hex(&img);
    let port = free_tcp_port();
    let _server = serve(&served, port);
    let url = format!("http://10.0.2.2:{port}/disk.raw");

    // A wrong SHA-256: failed, and what is on the disk does not boot.
    let bad = "00".repeat(32);
    let v = seen.bcctl(
        cp,
        &[
            "nodes",
            "deploy",
            &w_id,
            "--image-url",
            &url,
            "--image-sha256",
            &bad,
        ],
        None,
    );
    assert_eq!(v["provisionState"], "deploying", "{v:#}");
    let n = until_state(seen, cp, &w_id, "failed", dump);
    let c = condition(&n, "Deployed").unwrap();
    assert_eq!(c["reason"], "ChecksumMismatch", "{n:#}");
    assert_eq!(n["failedFrom"], "deploying", "{n:#}");
    rig.rig.until_off(&w.uuid);
    assert!(
        zero(&read_at(&w_disk, 0, MIB as usize)),
        "after a checksum mismatch the disk's first MiB is not the image's"
    );

    // The machine never boots: the pool's deploy deadline fails it.
    set_deploy_deadline(seen, rig, "20s");
    machines.set_ignore(&w.uuid, true);
    let deploy_args = [
        "nodes",
        "deploy",
        &w_id,
        "--image-url",
        &url,
        "--image-sha256",
        &sha,
        "--root-serial",
        "NVME-w",
        "--hostname",
        "web-1",
        "--ssh-key",
        SSH_KEY,
    ];
    let v = seen.bcctl(cp, &deploy_args, None);
    assert_eq!(v["provisionState"], "deploying", "{v:#}");
    let n = until_state(seen, cp, &w_id, "failed", dump);
    let c = condition(&n, "Deployed").unwrap();
    assert_eq!(c["reason"], "DeployDeadline", "{n:#}");
    assert!(
        c["message"].as_str().unwrap().contains("never booted"),
        "{c:#}"
    );

    // The harness lets it boot; nodes.recover deploys the same image again.
    set_deploy_deadline(seen, rig, "15m");
    machines.set_ignore(&w.uuid, false);
    let started = Instant::now();
    let v = seen.bcctl(cp, &["nodes", "recover", &w_id], None);
    assert_eq!(v["provisionState"], "deploying", "{v:#}");
    let n = until_state(seen, cp, &w_id, "deployed", dump);
    let deployed_in = started.elapsed();
    assert_eq!(
        condition(&n, "Deployed").unwrap()["status"],
        "true",
        "{n:#}"
    );
    let deploy_steps = steps(seen, cp, &w_id, "deployStep");
    let written = deploy_steps
        .iter()
        .rfind(|s| s.starts_with("imageWritten"))
        .unwrap_or_else(|| panic!("no imageWritten: {deploy_steps:#?}"))
        .clone();
    assert!(
        written.contains("nvme0n1") && written.contains(&sha),
        "{written}"
    );
    for step in ["bootDeviceSet", "rebooted"] {
        assert!(
            deploy_steps.iter().any(|s| s.starts_with(step)),
            "{step}: {deploy_steps:#?}"
        );
    }
    // Rebooted onto its disk, which the harness does not boot: the VM stops.
    eventually(WAIT, "machine w's VM stopped after the reboot", || {
        (!machines.running(&w.uuid)).then_some(())
    });
    let disk = std::fs::read(&w_disk).unwrap();
    assert_eq!(&disk[512..520], b"EFI PART", "the image's GPT");
    let at = (MIB + 4096) as usize;
    assert_eq!(
        &disk[at..at + IMAGE_MARKER.len()],
        IMAGE_MARKER,
        "the image's bytes"
    );
    let find = |needle: &[u8]| disk.windows(needle.len()).position(|w| w == needle);
    let host = find(b"local-hostname: \"web-1\"").expect("the config drive's meta-data");
    // The config drive is a partition added after the image's last one (which ends at 2 MiB).
    assert!(
        host as u64 >= 2 * MIB,
        "the config drive is after the image's partitions: {host}"
    );
    let sfdisk = Command::new("sfdisk")
        .arg("--json")
        .arg(&w_disk)
        .output()
        .unwrap();
    let table: serde_json::Value = serde_json::from_slice(&sfdisk.stdout).unwrap();
    let parts = table["partitiontable"]["partitions"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(
        parts.len(),
        2,
        "the image's partition and the config drive: {table:#}"
    );
    assert_eq!(parts[1]["name"], "cidata", "{table:#}");
    assert_eq!(
        table["partitiontable"]["lastlba"].as_u64(),
        Some(64 * MIB / 512 - 34),
        "the GPT grown to the VM's 64 MiB disk: {table:#}"
    );
    assert!(
        find(SSH_KEY.as_bytes()).is_some(),
        "the key on the config drive"
    );
    assert!(
        find(b"CIDATA").or_else(|| find(b"cidata")).is_some(),
        "the config drive's label"
    );
    // The BMC boots the disk from now on.
    let sys = rig.rt.block_on(rig.sushy.system(&w.uuid));
    assert_eq!(sys["Boot"]["BootSourceOverrideTarget"], "Hdd", "{sys:#}");
    let site_agent = seen.ok(cp, "sites.get", json!({"siteId": site}))["lease"]["holderNodeId"]
        .as_str()
        .unwrap()
        .to_owned();
    let cmds = seen.ok(
        cp,
        "commands.list",
        json!({"nodeId": site_agent, "limit": 500}),
    );
    let boot_device = cmds["commands"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "bmc.setBootDevice" && c["args"]["nodeId"] == w_id.as_str())
        .unwrap_or_else(|| panic!("no bmc.setBootDevice: {cmds:#}"))
        .clone();
    assert_eq!(
        (
            &boot_device["args"]["device"],
            &boot_device["args"]["persistent"],
            &boot_device["state"]
        ),
        (&json!("disk"), &json!(true), &json!("succeeded")),
        "{boot_device:#}"
    );
    eprintln!(
        "metal_workflows: deploy of w (recover -> deployed, one TCG boot, 8 MiB raw image + config drive): {:.1} s; {written}",
        deployed_in.as_secs_f64()
    );
    deployed_system_joins(seen, rig, w, &w_id, &disk);
}

/// Issue 30.1: the deploy wrote the system its own identity (`bcd-join-token` on the config
/// drive): the deployed system's agent joins as w with it, while the pool's join token, showing
/// the same machine, is refused `BARE_METAL_NODE`; the stored `image.write` no longer holds it.
fn deployed_system_joins(
    seen: &mut Seen,
    rig: &DeployRig<'_>,
    w: &bc_metal_sim::machines::Machine,
    w_id: &str,
    disk: &[u8],
) {
    use bc_protocol::hwid::{self, Kind};
    let cp = rig.cp;
    let at = disk
        .windows(7)
        .position(|x| x == b"deploy_")
        .expect("the deploy identity on the config drive");
    let token: String = disk[at..]
        .iter()
        .take_while(|b| b.is_ascii_alphanumeric() || **b == b'_' || **b == b'.')
        .map(|b| char::from(*b))
        .collect();
    assert_eq!(token.len(), "deploy_".len() + 20 + 1 + 40, "{token}");
    let mut lines = [
        hwid::uuid_line(&w.uuid).unwrap(),
        hwid::serial_line(Kind::SystemSerial, &w.serial).unwrap(),
        hwid::mac_line(&w.mac).unwrap(),
    ];
    lines.sort();
    let key = hwid::digest(&lines.join("\n"));
    let digests: Vec<String> = lines.iter().map(|l| hwid::digest(l)).collect();
    let refs: Vec<&str> = digests.iter().map(String::as_str).collect();
    let agent = bc_e2e::fake_agent::FakeAgent::new(cp);
    let pool_token = cp.create_token(&["--pool", rig.pool]);
    let refused = agent
        .join_as(AgentMode::Node, &pool_token, &key, true, &refs)
        .expect_err("the pool's join token must not re-join a deployed machine in place");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert!(
        refused.message().starts_with("BARE_METAL_NODE"),
        "{refused:?}"
    );
    let before = seen.node(cp, w_id)["identityGeneration"].as_u64().unwrap();
    let j = agent
        .join_as(AgentMode::Node, &token, &key, true, &refs)
        .expect("the deployed system joins with its deploy identity");
    assert_eq!(j.node_id, w_id);
    assert_eq!(j.identity_generation, before + 1);
    let writes = seen.ok(cp, "commands.list", json!({"nodeId": w_id, "limit": 500}));
    let shown = writes.to_string();
    assert!(
        !shown.contains(token.split_once('.').unwrap().1),
        "no commands answer shows the identity: {shown}"
    );
}
