//! Bare-metal workflows booted for real (issue 16), on the rig of `metal_vm.rs`: sushy-emulator's
//! Redfish BMCs, a real `bcd site` with its boot service, QEMU machines PXE-booting the ramdisk
//! built by `packaging/ramdisk/build.sh`, and a real `bcctl serve`.
//! - Machine x runs "its own OS": a disk with a GPT and a tenant's data. Enrolled with
//!   `--deployed` it is `deployed` without a boot; `nodes release` boots the ramdisk, which
//!   erases the metadata of every disk → `ready`, powered off; the harness reads the VM's disk:
//!   both GPT headers and the partitions' first MiB are zero, the data in the middle is still
//!   there (metadata mode). `nodes retire` cleans again → `retired`, powered off, not
//!   schedulable, its identity ended.
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
use bcd_site::test_utils::free_tcp_port;
use bcd_site::test_utils::sushy::Sushy;
use metal::{enroll_with, machine, moves, system, until_state};
use serde_json::json;
use support::{Seen, SiteAgent, WAIT, condition};

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

/// Waits until machine `uuid`'s VM is stopped and the emulator says Off.
fn until_off(machines: &Machines, sushy: &Sushy, rt: &tokio::runtime::Runtime, uuid: &str) {
    eventually(WAIT, "the machine powered off", || {
        (!machines.running(uuid) && rt.block_on(sushy.power(uuid)) == "Off").then_some(())
    });
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
    if Sushy::program("metal_workflows").is_none() {
        return;
    }
    let x = machine("x", 11, "SER-X-0011", false);
    let systems = [system(&x, "SER-X-0011")];
    let (_, bcd) = ramdisk::bins();
    let tmp = tempfile::tempdir().unwrap();
    let image = ramdisk::build_image(&tools, bcd, &tmp.path().join("image"));
    let (boot_port, gw_port) = (free_tcp_port(), free_tcp_port());
    // Machine x's disk holds "its OS": a GPT, and the tenant's data in the middle.
    let x_disk = Machines::disk(tmp.path(), &x.name);
    gpt_disk(&x_disk, 64 * MIB);
    write_at(&x_disk, 2 * MIB, b"ext4-superblock-stand-in");
    write_at(&x_disk, 30 * MIB, TENANT_DATA);
    let machines = Machines::start(
        &tools.qemu,
        vec![x.clone()],
        &format!("http://10.0.2.2:{boot_port}/boot.ipxe?mac=${{net0/mac}}"),
        tmp.path(),
    )
    .expect("the machines' notifier");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let sushy = rt
        .block_on(Sushy::start_notifying(
            "metal_workflows",
            &systems,
            &machines.notify_url,
        ))
        .expect("sushy-emulator");
    let mut cp = ControlPlane::start_with_args(
        &tmp.path().join("cp"),
        &[
            "--listen",
            &format!("127.0.0.1:{gw_port}"),
            "--api-listen",
            "127.0.0.1:0",
            "--san",
            "10.0.2.2",
            "--advertise-url",
            &format!("https://10.0.2.2:{gw_port}"),
            "--site-lease-ttl",
            "4s",
            "--power-sync-interval",
            "1s",
        ],
    );
    cp.gateway_url = format!("https://127.0.0.1:{gw_port}");
    let mut seen = Seen::default();
    let site = seen.ok(
        &cp,
        "sites.create",
        json!({"name": "dc1", "kind": "platform"}),
    );
    let site = site["id"].as_str().unwrap().to_owned();
    let p = seen.bcctl(
        &cp,
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
    let token = cp.create_token(&["--site", &site]);
    let agent = SiteAgent::start_with(
        &cp,
        tmp.path(),
        "site-a",
        &token,
        &[
            "--boot-listen",
            &format!("127.0.0.1:{boot_port}"),
            "--boot-kernel",
            image.kernel.to_str().unwrap(),
            "--boot-initrd",
            image.initrd.to_str().unwrap(),
        ],
    );
    eventually(WAIT, "the site agent holding the lease", || {
        let s = seen.ok(&cp, "sites.get", json!({"siteId": site}));
        s["lease"]["holderNodeId"].as_str().map(str::to_owned)
    });
    let dump = |uuid: &str| {
        let uuid = uuid.to_owned();
        let machines = &machines;
        let agent = &agent;
        move || {
            format!(
                "consoles:\n{}\nsite agent:\n{}",
                machines.consoles(&uuid).join("\n----\n"),
                agent.log_text()
            )
        }
    };

    // Machine x: adopted as deployed (no boot), released, retired.
    let x_id = enroll_with(
        &mut seen,
        &cp,
        &site,
        &pool,
        "x",
        &sushy.address(&x.uuid),
        &["--deployed"],
    );
    let n = until_state(&mut seen, &cp, &x_id, "deployed", &dump(&x.uuid));
    assert_eq!(moves(&mut seen, &cp, &x_id), ["enrolling", "deployed"]);
    assert!(
        !machines
            .happened()
            .iter()
            .any(|(_, h)| *h == Happened::Started(x.uuid.clone())),
        "a machine enrolled as deployed is never booted"
    );
    let generation = n["identityGeneration"].as_u64().unwrap();
    let started = Instant::now();
    let v = seen.bcctl(&cp, &["nodes", "release", &x_id], None);
    assert_eq!(v["provisionState"], "releasing", "{v:#}");
    assert!(
        v["identityGeneration"].as_u64().unwrap() > generation,
        "{v:#}"
    );
    let n = until_state(&mut seen, &cp, &x_id, "ready", &dump(&x.uuid));
    let released_in = started.elapsed();
    let cleaned = condition(&n, "Cleaned").unwrap();
    assert_eq!(cleaned["status"], "true", "{n:#}");
    let clean_steps = steps(&mut seen, &cp, &x_id, "cleaningStep");
    let disk_step = clean_steps
        .iter()
        .find(|s| s.starts_with("cleaned nvme0n1"))
        .unwrap_or_else(|| panic!("no cleaned nvme0n1: {clean_steps:#?}"));
    assert!(disk_step.contains("serial NVME-x"), "{disk_step}");
    assert_eq!(
        moves(&mut seen, &cp, &x_id),
        ["enrolling", "deployed", "releasing", "ready"]
    );
    until_off(&machines, &sushy, &rt, &x.uuid);
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

    let before = seen.node(&cp, &x_id)["identityGeneration"]
        .as_u64()
        .unwrap();
    let v = seen.bcctl(&cp, &["nodes", "retire", &x_id], None);
    assert_eq!(v["provisionState"], "retiring", "{v:#}");
    let n = until_state(&mut seen, &cp, &x_id, "retired", &dump(&x.uuid));
    assert!(
        n["identityGeneration"].as_u64().unwrap() >= before + 2,
        "the retire and the retired ramdisk each ended an identity: {n:#}"
    );
    assert_eq!(n["schedulable"], false, "{n:#}");
    until_off(&machines, &sushy, &rt, &x.uuid);
    assert_eq!(moves(&mut seen, &cp, &x_id)[4..], ["retiring", "retired"]);

    drop(agent);
}
