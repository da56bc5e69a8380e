//! Early boot against a fixture `/sys/class/net` and fake `modprobe` and `udhcpc` scripts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::*;

/// A temp dir with a fixture `/sys/class/net` and fake tools that log their arguments.
struct Bed {
    dir: tempfile::TempDir,
}

impl Bed {
    fn new() -> Self {
        let bed = Self {
            dir: tempfile::tempdir().unwrap(),
        };
        std::fs::create_dir_all(bed.root().join("sys/class/net")).unwrap();
        bed
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("calls.log")
    }

    /// An interface: `kind` 1 is Ethernet; `device` gives it a device link.
    fn iface(&self, name: &str, kind: u32, device: bool) {
        let d = self.root().join("sys/class/net").join(name);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("type"), format!("{kind}\n")).unwrap();
        std::fs::write(d.join("flags"), "0x1002\n").unwrap();
        if device {
            std::os::unix::fs::symlink(
                "../../../devices/pci0000:00/0000:00:03.0",
                d.join("device"),
            )
            .unwrap();
        }
    }

    /// An Ethernet NIC with a device, its MAC and whether it has a link.
    fn nic(&self, name: &str, mac: &str, carrier: bool) {
        self.iface(name, 1, true);
        let d = self.root().join("sys/class/net").join(name);
        std::fs::write(d.join("address"), format!("{mac}\n")).unwrap();
        std::fs::write(d.join("carrier"), if carrier { "1\n" } else { "0\n" }).unwrap();
    }

    fn flags(&self, name: &str) -> String {
        std::fs::read_to_string(self.root().join("sys/class/net").join(name).join("flags"))
            .unwrap()
            .trim()
            .to_owned()
    }

    /// A shell script tool named `name` whose body sees the log file as `$LOG`.
    fn tool(&self, name: &str, body: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        let text = format!(
            "#!/bin/sh\nLOG='{}'\necho \"{name} $*\" >> \"$LOG\"\n{body}\n",
            self.log().display()
        );
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.log())
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    fn config(&self, udhcpc: &Path) -> SetupConfig {
        let mut cfg = SetupConfig::new(HostRoot::new(self.root()), &[]);
        cfg.udhcpc = udhcpc.to_owned();
        cfg.modprobe = self.dir.path().join("no-modprobe");
        cfg.link_wait = Duration::from_millis(300);
        cfg.dhcp_timeout = Duration::from_secs(3);
        cfg.attempt_timeout = Duration::from_secs(2);
        cfg.poll = Duration::from_millis(20);
        cfg.carrier_wait = Duration::from_millis(100);
        cfg
    }
}

/// udhcpc that leases only on `good`, and says why not elsewhere, like busybox's.
fn udhcpc_leasing_on(bed: &Bed, good: &str) -> PathBuf {
    bed.tool(
        "udhcpc",
        &format!(
            "if [ \"$2\" = {good} ]; then echo 'udhcpc: lease of 10.0.2.15 obtained from 10.0.2.2, lease time 86400'; exit 0; fi\necho 'udhcpc: started, v1.35.0'; echo 'udhcpc: no lease, failing' >&2; exit 1"
        ),
    )
}

#[test]
fn only_ethernet_interfaces_with_a_device_count() {
    let bed = Bed::new();
    bed.iface("lo", 772, false);
    bed.iface("docker0", 1, false);
    bed.iface("ib0", 32, true);
    bed.iface("eth1", 1, true);
    bed.iface("eth0", 1, true);
    assert_eq!(
        ethernet_interfaces(&HostRoot::new(bed.root())),
        ["eth0", "eth1"]
    );
}

#[tokio::test]
async fn the_first_interface_that_gets_a_lease_wins_and_those_before_are_reported() {
    let bed = Bed::new();
    bed.iface("eth0", 1, true);
    bed.iface("eth1", 1, true);
    bed.iface("lo", 772, false);
    let cfg = bed.config(&udhcpc_leasing_on(&bed, "eth1"));
    let lease = dhcp(&cfg).await.unwrap();
    assert_eq!(lease.iface, "eth1");
    assert!(
        lease.output.contains("lease of 10.0.2.15"),
        "{}",
        lease.output
    );
    assert_eq!(lease.tried.len(), 1);
    assert_eq!(lease.tried[0].iface, "eth0");
    assert!(
        lease.tried[0].last.contains("no lease, failing"),
        "{:?}",
        lease.tried
    );
    assert_eq!(
        bed.calls(),
        [
            "udhcpc -i eth0 -q -n -t 5 -T 1 -s /etc/udhcpc.sh",
            "udhcpc -i eth1 -q -n -t 5 -T 1 -s /etc/udhcpc.sh",
        ]
    );
    // Both were brought up through sysfs (IFF_UP added to 0x1002).
    assert_eq!(
        (bed.flags("eth0"), bed.flags("eth1")),
        ("0x1003".into(), "0x1003".into())
    );
}

#[tokio::test]
async fn no_lease_anywhere_names_every_interface_and_what_udhcpc_said() {
    let bed = Bed::new();
    bed.iface("eth0", 1, true);
    bed.iface("eno1", 1, true);
    let mut cfg = bed.config(&udhcpc_leasing_on(&bed, "none"));
    cfg.dhcp_timeout = Duration::from_millis(1500);
    let started = std::time::Instant::now();
    let err = dhcp(&cfg).await.unwrap_err();
    eprintln!("gave up after {:?}", started.elapsed());
    let SetupError::NoLease { tried, .. } = &err else {
        panic!("{err:?}");
    };
    let names: Vec<&str> = tried.iter().map(|a| a.iface.as_str()).collect();
    assert_eq!(names, ["eno1", "eth0"]);
    assert!(tried.iter().all(|a| a.runs >= 1));
    let msg = err.to_string();
    assert!(
        msg.starts_with("no DHCP lease within 1.5s; tried eno1 ("),
        "{msg}"
    );
    assert!(msg.contains("eth0 ("), "{msg}");
    assert!(
        msg.contains("exit status: 1: udhcpc: started, v1.35.0 | udhcpc: no lease, failing"),
        "{msg}"
    );
}

#[tokio::test]
async fn a_missing_udhcpc_is_said_plainly() {
    let bed = Bed::new();
    bed.iface("eth0", 1, true);
    let mut cfg = bed.config(&bed.dir.path().join("no-udhcpc"));
    cfg.dhcp_timeout = Duration::from_millis(200);
    let msg = dhcp(&cfg).await.unwrap_err().to_string();
    assert!(msg.contains("eth0 ("), "{msg}");
    assert!(msg.contains("cannot run"), "{msg}");
    assert!(msg.contains("no-udhcpc"), "{msg}");
}

#[tokio::test]
async fn a_hung_udhcpc_is_killed_at_its_limit() {
    let bed = Bed::new();
    bed.iface("eth0", 1, true);
    let mut cfg = bed.config(&bed.tool("udhcpc", "exec sleep 30"));
    cfg.attempt_timeout = Duration::from_millis(300);
    cfg.dhcp_timeout = Duration::from_millis(500);
    let msg = dhcp(&cfg).await.unwrap_err().to_string();
    assert!(msg.contains("killed after 300ms"), "{msg}");
}

#[tokio::test]
async fn without_a_nic_the_error_lists_what_was_there() {
    let bed = Bed::new();
    bed.iface("lo", 772, false);
    bed.iface("br0", 1, false);
    let cfg = bed.config(&udhcpc_leasing_on(&bed, "eth0"));
    let err = run(&cfg, None).await.unwrap_err();
    assert!(matches!(err, SetupError::NoInterfaces { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("within 300ms (present: br0, lo)"), "{msg}");
    assert!(bed.calls().iter().all(|c| !c.starts_with("udhcpc")));
}

#[tokio::test]
async fn a_nic_that_appears_late_is_waited_for() {
    let bed = Bed::new();
    let mut cfg = bed.config(&udhcpc_leasing_on(&bed, "eth0"));
    cfg.link_wait = Duration::from_secs(10);
    let root = bed.root();
    let late = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let d = root.join("sys/class/net/eth0");
        std::fs::create_dir_all(d.join("device")).unwrap();
        std::fs::write(d.join("flags"), "0x1002\n").unwrap();
        std::fs::write(d.join("type"), "1\n").unwrap();
    });
    let started = std::time::Instant::now();
    let found = wait_for_interfaces(&cfg).await.unwrap();
    eprintln!("found {found:?} after {:?}", started.elapsed());
    late.await.unwrap();
    assert_eq!(found, ["eth0"]);
}

#[tokio::test]
async fn module_failures_are_reported_and_never_stop_the_rest() {
    let bed = Bed::new();
    bed.iface("lo", 772, false);
    bed.iface("eth0", 1, true);
    let mut cfg = bed.config(&udhcpc_leasing_on(&bed, "eth0"));
    cfg.modprobe = bed.tool(
        "modprobe",
        "case \"$1\" in ice|mlx5_core) echo \"modprobe: module $1 not found in modules.dep\" >&2; exit 1;; esac",
    );
    cfg.modules.push("tg3".into());
    let loads = load_modules(&cfg).await;
    let failed: Vec<(&str, &str)> = loads
        .iter()
        .filter_map(|l| {
            l.result
                .as_ref()
                .err()
                .map(|e| (l.name.as_str(), e.as_str()))
        })
        .collect();
    assert_eq!(failed.len(), 2, "{failed:?}");
    assert_eq!(failed[0].0, "ice");
    assert!(
        failed[0].1.contains("module ice not found"),
        "{}",
        failed[0].1
    );
    assert_eq!(loads.len(), DEFAULT_MODULES.len() + 1);
    // modprobe ran once per module, in order, and then DHCP went ahead.
    let lease = run(&cfg, None).await.unwrap();
    assert_eq!(lease.iface, "eth0");
    let calls = bed.calls();
    assert_eq!(calls[0], "modprobe virtio_pci");
    assert_eq!(calls[loads.len() - 1], "modprobe tg3");
    assert_eq!(bed.flags("lo"), "0x1003");
}

#[tokio::test]
async fn a_missing_modprobe_fails_each_module_but_not_the_boot() {
    let bed = Bed::new();
    bed.iface("eth0", 1, true);
    let cfg = bed.config(&udhcpc_leasing_on(&bed, "eth0"));
    let loads = load_modules(&cfg).await;
    assert!(
        loads
            .iter()
            .all(|l| l.result.as_ref().is_err_and(|e| e.contains("cannot run")))
    );
    assert_eq!(run(&cfg, None).await.unwrap().iface, "eth0");
}

#[test]
fn extra_modules_come_after_the_defaults_once() {
    let cfg = SetupConfig::new(HostRoot::new("/"), &["tg3".into(), "nvme".into()]);
    assert_eq!(cfg.modules.len(), DEFAULT_MODULES.len() + 1);
    assert_eq!(cfg.modules.last().map(String::as_str), Some("tg3"));
}

#[test]
fn the_image_loads_the_same_modules() {
    let listed = include_str!("../../packaging/ramdisk/modules");
    let names: Vec<&str> = listed
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(names, DEFAULT_MODULES, "packaging/ramdisk/modules differs");
}

#[tokio::test]
async fn the_node_id_names_a_machine_dhcp_left_unnamed() {
    let bed = Bed::new();
    bed.iface("eth0", 1, true);
    let host = bed.root().join("proc/sys/kernel/hostname");
    std::fs::create_dir_all(host.parent().unwrap()).unwrap();
    std::fs::write(&host, "(none)\n").unwrap();
    let cfg = bed.config(&udhcpc_leasing_on(&bed, "eth0"));
    run(&cfg, Some("node_7")).await.unwrap();
    assert_eq!(std::fs::read_to_string(&host).unwrap(), "node_7");
    // A name DHCP gave (the udhcpc script set it) stays.
    std::fs::write(&host, "rack4-u12\n").unwrap();
    run(&cfg, Some("node_7")).await.unwrap();
    assert_eq!(std::fs::read_to_string(&host).unwrap().trim(), "rack4-u12");
}

/// The field server's 14 Ethernet ports (`many-nics-bootif`), the provisioning one 13th by name.
const FOURTEEN: [&str; 14] = [
    "eno8303",
    "eno8403",
    "enp156s0np0",
    "enp188s0np0",
    "enp204s0np0",
    "enp220s0np0",
    "enp26s0np0",
    "enp41s0f0np0",
    "enp41s0f1np1",
    "enp60s0np0",
    "enp77s0np0",
    "enp94s0np0",
    "ens3f0np0",
    "ens3f1np1",
];

/// A reachability check that fails for the interfaces in `dead`.
fn reach_except(dead: &[&str]) -> crate::nics::ReachCheck {
    let dead: Vec<String> = dead.iter().map(|d| (*d).to_owned()).collect();
    crate::nics::ReachCheck::new(move |iface| {
        let bad = dead.contains(&iface);
        Box::pin(async move {
            if bad {
                Err("10.0.0.1:7443: connection refused".to_owned())
            } else {
                Ok(())
            }
        })
    })
}

#[tokio::test]
async fn the_boot_nic_is_asked_first_of_fourteen() {
    let bed = Bed::new();
    for (i, name) in FOURTEEN.iter().enumerate() {
        let mac = match *name {
            "ens3f0np0" => "00:0a:f7:d2:30:00".to_owned(),
            _ => format!("94:6d:ae:3a:00:{i:02x}"),
        };
        bed.nic(name, &mac, false);
    }
    let mut cfg = bed.config(&udhcpc_leasing_on(&bed, "ens3f0np0"));
    cfg.boot_mac = Some("00:0a:f7:d2:30:00".into());
    let started = std::time::Instant::now();
    let lease = dhcp(&cfg).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(lease.iface, "ens3f0np0");
    assert!(lease.tried.is_empty() && lease.reachable);
    let udhcpc: Vec<String> = bed
        .calls()
        .into_iter()
        .filter(|c| c.starts_with("udhcpc"))
        .collect();
    assert_eq!(
        udhcpc,
        ["udhcpc -i ens3f0np0 -q -n -t 5 -T 1 -s /etc/udhcpc.sh"]
    );
    let s = lease.summary();
    assert!(
        s.starts_with("DHCP order: ens3f0np0 (BOOTIF), eno8303 (no carrier), eno8403 (no carrier)")
            && s.ends_with("; lease on ens3f0np0"),
        "{s}"
    );
}

#[tokio::test]
async fn nics_with_a_link_come_before_the_rest() {
    let bed = Bed::new();
    bed.nic("eth0", "52:54:00:00:00:01", false);
    bed.nic("eth1", "52:54:00:00:00:02", true);
    let cfg = bed.config(&udhcpc_leasing_on(&bed, "eth1"));
    let lease = dhcp(&cfg).await.unwrap();
    assert_eq!(lease.iface, "eth1");
    assert!(
        lease.tried.is_empty(),
        "eth0 was not asked: {:?}",
        lease.tried
    );
    assert_eq!(
        crate::nics::describe_order(&lease.order),
        "eth1 (carrier), eth0 (no carrier)"
    );
}

#[tokio::test]
async fn a_lease_from_which_the_control_plane_cannot_be_reached_is_given_back() {
    let bed = Bed::new();
    // eth0 has a link on another network whose DHCP answers; eth1 is the provisioning one.
    bed.nic("eth0", "52:54:00:00:00:01", true);
    bed.nic("eth1", "52:54:00:00:00:02", false);
    let udhcpc = bed.tool(
        "udhcpc",
        "echo \"udhcpc: lease of 10.9.0.7 obtained on $2\"; exit 0",
    );
    let mut cfg = bed.config(&udhcpc);
    cfg.udhcpc_script = bed.tool(
        "udhcpc.sh",
        "echo \"script-env interface=$interface\" >> \"$LOG\"",
    );
    cfg.reach = reach_except(&["eth0"]);
    let lease = dhcp(&cfg).await.unwrap();
    assert_eq!(lease.iface, "eth1");
    assert!(lease.reachable);
    assert_eq!(lease.tried.len(), 1);
    assert_eq!(lease.tried[0].iface, "eth0");
    assert!(
        lease.tried[0].last.contains(
            "the control plane did not answer (10.0.0.1:7443: connection refused); given back"
        ),
        "{:?}",
        lease.tried
    );
    let calls = bed.calls();
    let i = calls
        .iter()
        .position(|c| c == "script-env interface=eth0")
        .expect("eth0's lease given back through the script's deconfig");
    assert!(calls[i - 1].ends_with("udhcpc.sh deconfig"), "{calls:?}");
    assert_eq!(bed.flags("eth0"), "0x1002", "eth0 taken down");
    let s = lease.summary();
    assert!(
        s.contains("; lease on eth1; left: eth0 (1 runs; last: leased (udhcpc: lease of 10.9.0.7 obtained on eth0)"),
        "{s}"
    );
}

#[tokio::test]
async fn when_no_lease_reaches_the_control_plane_the_boot_nics_is_kept() {
    let bed = Bed::new();
    bed.nic("eth0", "52:54:00:00:00:01", true);
    bed.nic("eth1", "52:54:00:00:00:02", false);
    let udhcpc = bed.tool("udhcpc", "echo \"udhcpc: lease obtained on $2\"; exit 0");
    let mut cfg = bed.config(&udhcpc);
    cfg.udhcpc_script = bed.tool("udhcpc.sh", "true");
    cfg.boot_mac = Some("52:54:00:00:00:02".into());
    cfg.reach = reach_except(&["eth0", "eth1"]);
    cfg.dhcp_timeout = Duration::from_millis(1200);
    let lease = dhcp(&cfg).await.unwrap();
    assert_eq!((lease.iface.as_str(), lease.reachable), ("eth1", false));
    assert!(
        lease
            .tried
            .iter()
            .all(|a| a.last.contains("did not answer"))
    );
    assert!(
        lease
            .summary()
            .contains("lease on eth1 (the control plane did not answer from any lease"),
        "{}",
        lease.summary()
    );
}
