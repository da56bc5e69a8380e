//! Issue 20.2's LLDP neighbours on real links: two network namespaces joined by two veth
//! pairs; Debian's `lldpd` speaks on the far end of one pair with a known system name, system
//! description, port description and chassis MAC; the real `bcd inventory --lldp-wait` runs on
//! the near end (`ip netns exec`, so `/sys/class/net` is the namespace's).
//!
//! - The link with the speaker reports its neighbour, and the wait ends once it heard it.
//! - The link without one has no `lldp` after the bounded wait, which lasts its bound.
//! - With `CAP_NET_RAW` dropped (`setpriv`), the inventory still comes out, without `lldp`,
//!   with a note and a log line that name the capability.
//! - The background `Watcher` (node agent, ramdisk), run in the near namespace, holds the
//!   neighbour and drops it once lldpd stops.
//!
//! Needs root, `ip` (iproute2), `lldpd` and `lldpcli` (lldpd), `setpriv` (util-linux): without
//! them the test says `!!! SKIPPED` and returns, and under `CI=true` fails (`.ci/run` installs
//! them). lldpd runs with its own control socket and pid file in a temp dir, only on its veth,
//! so a system lldpd is neither used nor disturbed. Everything is removed on drop, panics too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use bc_protocol::inventory::{Inventory, Nic};
use bcd_probes::inventory::lldp::Watcher;

/// What lldpd is told to say.
const SYSTEM_NAME: &str = "bcd-e2e-leaf";
const SYSTEM_DESCRIPTION: &str = "bcd e2e switch (lldpd)";
const PORT_DESCRIPTION: &str = "bcd-e2e-port-7";
/// The far end's MAC: lldpd's chassis id when it has one interface (`-C` unset).
const FAR_MAC: &str = "02:bc:d0:00:00:02";
/// `tx-interval` × `tx-hold`: the TTL lldpd sends.
const TX_INTERVAL_S: u16 = 1;
const TX_HOLD: u16 = 10;

/// `--lldp-wait` of the runs that hear their neighbour: far more than they take.
const LONG_WAIT_S: u64 = 10;
/// `--lldp-wait` of the run that also listens on the silent link: it lasts this long.
const SHORT_WAIT_S: u64 = 3;

/// Finds what the test needs, or says why not (outside CI) / fails (under `CI=true`).
fn tools_or_skip() -> bool {
    let missing = ["ip", "lldpd", "lldpcli", "setpriv"]
        .into_iter()
        .find(|tool| {
            !Command::new("sh")
                .arg("-c")
                .arg(format!(
                    "command -v {tool} || test -x /usr/sbin/{tool} || test -x /sbin/{tool}"
                ))
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .map(|tool| format!("{tool} is not installed"))
        .or_else(|| {
            (!nix::unistd::geteuid().is_root())
                .then(|| "not root (network namespaces and raw sockets)".to_owned())
        });
    let Some(m) = missing else {
        return true;
    };
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "lldp: cannot run: {m} (.ci/run installs it)"
    );
    eprintln!("!!! lldp: SKIPPED, cannot run: {m} (.ci/run installs it)");
    false
}

/// Runs `args`, panicking with its output when it fails.
fn run(args: &[&str]) -> Output {
    let o = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        o.status.success(),
        "{args:?}: {}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// Two network namespaces, deleted (with their veths) when dropped.
struct Namespaces {
    near: String,
    far: String,
}

impl Namespaces {
    fn new(tag: &str) -> Self {
        let ns = Self {
            near: format!("bcd-lldp-near-{tag}"),
            far: format!("bcd-lldp-far-{tag}"),
        };
        for n in [&ns.near, &ns.far] {
            // A leftover of a killed run of the same pid would make `add` fail.
            let _ = Command::new("ip").args(["netns", "del", n]).output();
            run(&["ip", "netns", "add", n]);
        }
        ns
    }

    /// A veth pair `near_if` (in near) — `far_if` (in far, with `far_mac`), both up.
    fn veth(&self, near_if: &str, far_if: &str, far_mac: &str) {
        run(&[
            "ip", "link", "add", near_if, "netns", &self.near, "type", "veth", "peer", "name",
            far_if, "address", far_mac, "netns", &self.far,
        ]);
        run(&["ip", "-n", &self.near, "link", "set", near_if, "up"]);
        run(&["ip", "-n", &self.far, "link", "set", far_if, "up"]);
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for n in [&self.near, &self.far] {
            let _ = Command::new("ip").args(["netns", "del", n]).output();
        }
    }
}

/// A process killed and reaped when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts lldpd in `ns` on `iface` only, with the known names, its control socket, pid file
/// and configuration (read by its lldpcli at start) in `dir`.
fn start_lldpd(ns: &str, iface: &str, dir: &Path) -> Killed {
    // lldpd's unprivileged half reaches the control socket: the dir must be searchable.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let conf = dir.join("lldpd.conf");
    std::fs::write(
        &conf,
        format!(
            "configure system hostname {SYSTEM_NAME}\n\
             configure lldp tx-interval {TX_INTERVAL_S}\n\
             configure lldp tx-hold {TX_HOLD}\n\
             configure ports {iface} lldp portdescription {PORT_DESCRIPTION}\n"
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.join("lldpd.log")).unwrap();
    let child = Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            "lldpd",
            "-d",
            "-I",
            iface,
            "-S",
            SYSTEM_DESCRIPTION,
        ])
        .arg("-u")
        .arg(dir.join("lldpd.socket"))
        .arg("-p")
        .arg(dir.join("lldpd.pid"))
        .arg("-O")
        .arg(&conf)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    Killed(child)
}

/// `bcd inventory -o json --lldp-wait <wait>` with `--lldp-interface` for each of `ifaces`, in
/// `ns`, behind `prefix` (setpriv); its inventory, its stderr and how long it took.
fn inventory(
    bcd: &Path,
    ns: &str,
    prefix: &[&str],
    wait: u64,
    ifaces: &[&str],
) -> (Inventory, String, Duration) {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns]).args(prefix).arg(bcd);
    cmd.args(["inventory", "-o", "json", "--lldp-wait", &wait.to_string()]);
    for i in ifaces {
        cmd.args(["--lldp-interface", i]);
    }
    let started = Instant::now();
    let o = cmd.env("BCD_LOG", "info").output().unwrap();
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{cmd:?}: {}\n{stderr}", o.status);
    let inv = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stdout)));
    (inv, stderr, took)
}

fn nic<'a>(inv: &'a Inventory, name: &str) -> &'a Nic {
    inv.nics
        .iter()
        .find(|n| n.name == name)
        .unwrap_or_else(|| panic!("no NIC {name}: {:#?}", inv.nics))
}

#[test]
fn lldpd_on_the_far_end_is_the_near_ends_neighbour_and_a_silent_link_has_none() {
    if !tools_or_skip() {
        return;
    }
    let bcd = bc_e2e::vm::build_bcd();
    let tmp = tempfile::tempdir().unwrap();
    let tag = std::process::id().to_string();
    let (heard_if, silent_if) = (format!("bl{tag}a"), format!("bl{tag}c"));
    let ns = Namespaces::new(&tag);
    ns.veth(&heard_if, &format!("bl{tag}b"), FAR_MAC);
    ns.veth(&silent_if, &format!("bl{tag}d"), "02:bc:d0:00:00:04");
    let lldpd = start_lldpd(&ns.far, &format!("bl{tag}b"), tmp.path());
    let lldpd_log = || std::fs::read_to_string(tmp.path().join("lldpd.log")).unwrap_or_default();

    // The speaker's link: heard, and the wait ends there (lldpd sends every second).
    let (inv, stderr, took) = inventory(&bcd, &ns.near, &[], LONG_WAIT_S, &[&heard_if]);
    let n = nic(&inv, &heard_if);
    assert_eq!(n.lldp.len(), 1, "{n:#?}\n{stderr}\nlldpd:\n{}", lldpd_log());
    let l = &n.lldp[0];
    assert_eq!(l.system_name.as_deref(), Some(SYSTEM_NAME), "{l:#?}");
    assert_eq!(l.system_description.as_deref(), Some(SYSTEM_DESCRIPTION));
    assert_eq!(l.port_description.as_deref(), Some(PORT_DESCRIPTION));
    assert_eq!(
        (l.chassis_id.as_str(), l.chassis_id_subtype.as_str()),
        (FAR_MAC, "macAddress")
    );
    assert!(
        !l.port_id.is_empty() && !l.port_id_subtype.is_empty(),
        "{l:#?}"
    );
    assert_eq!(l.ttl_seconds, TX_INTERVAL_S * TX_HOLD, "{l:#?}");
    assert!(
        took < Duration::from_secs(LONG_WAIT_S - 3),
        "the wait ends once the link heard an LLDPDU: {took:?}"
    );
    assert!(
        !inv.notes.iter().any(|n| n.source == "lldp"),
        "{:?}",
        inv.notes
    );

    // Both links: the silent one has nothing after the whole bound.
    let (inv, stderr, took) =
        inventory(&bcd, &ns.near, &[], SHORT_WAIT_S, &[&heard_if, &silent_if]);
    assert_eq!(nic(&inv, &heard_if).lldp.len(), 1, "{stderr}");
    assert!(
        nic(&inv, &silent_if).lldp.is_empty(),
        "{:#?}",
        nic(&inv, &silent_if)
    );
    assert!(
        took >= Duration::from_secs(SHORT_WAIT_S) && took < Duration::from_secs(SHORT_WAIT_S + 3),
        "a silent link is waited on for the bound, no longer: {took:?}"
    );

    // No CAP_NET_RAW: the inventory, no neighbours, and why.
    let (inv, stderr, took) = inventory(
        &bcd,
        &ns.near,
        &[
            "setpriv",
            "--inh-caps=-net_raw",
            "--bounding-set=-net_raw",
            "--",
        ],
        LONG_WAIT_S,
        &[&heard_if],
    );
    assert!(nic(&inv, &heard_if).lldp.is_empty(), "{stderr}");
    let note = inv
        .notes
        .iter()
        .find(|n| n.source == "lldp")
        .unwrap_or_else(|| panic!("no lldp note: {:?}", inv.notes));
    assert!(note.message.contains("CAP_NET_RAW"), "{note:?}");
    assert!(stderr.contains("CAP_NET_RAW"), "logged: {stderr}");
    assert!(
        inv.cpu.is_some() && !inv.nics.is_empty(),
        "the rest is there"
    );
    assert!(
        took < Duration::from_secs(3),
        "no waiting without the capability: {took:?}"
    );

    // The node agent's and the ramdisk's background listener, started from a thread in the
    // near namespace (its own thread inherits it): it holds the neighbour, and lets it go at
    // once when lldpd, stopped, says goodbye (its shutdown LLDPDU has TTL 0), well before the
    // neighbour's 10 s TTL would.
    let near = std::fs::File::open(format!("/run/netns/{}", ns.near)).unwrap();
    let links = vec![heard_if.clone()];
    let watcher = std::thread::spawn(move || {
        nix::sched::setns(&near, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        Watcher::spawn_on(links).unwrap()
    })
    .join()
    .unwrap();
    let held = watcher.wait_heard(Duration::from_secs(LONG_WAIT_S));
    assert_eq!(
        held.get(&heard_if).map(|n| n[0].system_name.as_deref()),
        Some(Some(SYSTEM_NAME)),
        "{held:?}"
    );
    assert!(watcher.problems().is_empty(), "{:?}", watcher.problems());
    let pid = nix::unistd::Pid::from_raw(i32::try_from(lldpd.0.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let stopped = Instant::now();
    bc_e2e::eventually(
        Duration::from_secs(3),
        "the neighbour dropped on lldpd's shutdown LLDPDU",
        || watcher.neighbors().is_empty().then_some(()),
    );
    eprintln!(
        "lldp: neighbour gone {:?} after lldpd's SIGTERM",
        stopped.elapsed()
    );
}
