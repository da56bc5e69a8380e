//! Issue 32, item 7: the ramdisk's DHCP in a QEMU machine (see `bc_e2e::vm`) with four NICs:
//! the first two on networks whose DHCP answers but from which the control plane cannot be
//! reached (QEMU user networks with `restrict=on`), the third on the provisioning network
//! (QEMU's user network, where the guest reaches the test's listener at 10.0.2.2), the fourth
//! with no network at all. `bcd ramdisk` runs in the guest with the kernel command line a site
//! writes (`bcd.url` = that listener), once naming the third NIC with `BOOTIF` and once without;
//! what it logged is checked: the order, each NIC asked and why it was left, the lease.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bc_e2e::vm;

const MACS: [&str; 4] = [
    "52:54:00:00:01:01",
    "52:54:00:00:01:02",
    "52:54:00:00:01:03",
    "52:54:00:00:01:04",
];

/// QEMU's four NICs, as the module docs describe them.
fn nics() -> Vec<String> {
    let mut a = Vec::new();
    for (i, net) in [
        "user,id=n0,net=10.9.0.0/24,restrict=on",
        "user,id=n1,net=10.8.0.0/24,restrict=on",
        "user,id=n2",
    ]
    .iter()
    .enumerate()
    {
        a.push("-netdev".to_owned());
        a.push((*net).to_owned());
        a.push("-device".to_owned());
        a.push(format!("e1000e,netdev=n{i},mac={},romfile=", MACS[i]));
    }
    a.push("-device".to_owned());
    a.push(format!("e1000e,mac={},romfile=", MACS[3]));
    a
}

/// The guest's script: the ramdisk's udhcpc event script, the command line, then `bcd ramdisk`
/// until it says how it got on the network (60 s at most; it never joins: the listener is no
/// control plane), and its log.
fn script(cmdline: &str) -> String {
    let udhcpc = include_str!("../../../packaging/ramdisk/udhcpc.sh");
    format!(
        "mkdir -p /etc\ncat > /etc/udhcpc.sh <<'EOF'\n{udhcpc}EOF\nchmod 755 /etc/udhcpc.sh\n\
         echo '{cmdline}' > /tmp/cmdline\n\
         bcd ramdisk --cmdline /tmp/cmdline --log-file /tmp/bcd.log --log info >/dev/null 2>&1 &\n\
         i=0; while [ $i -lt 120 ] && ! grep -q 'DHCP order: ' /tmp/bcd.log 2>/dev/null; do sleep 0.5; i=$((i+1)); done\n\
         kill $! 2>/dev/null; sleep 1\n\
         cat /tmp/bcd.log\n"
    )
}

/// Boots the machine with `BOOTIF` (or none) and returns what `bcd ramdisk` logged.
fn boot_with(
    tools: &vm::VmTools,
    bcd: &std::path::Path,
    port: u16,
    bootif: Option<&str>,
) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut cmdline = format!(
        "bcd.url=https://10.0.2.2:{port} bcd.pin=sha256:{} bcd.token=boot_vm.s3cret bcd.node=node_vm bcd.lldp_wait=0 bcd.dhcp_timeout=60",
        "5e".repeat(32)
    );
    if let Some(mac) = bootif {
        cmdline.push_str(&format!(" BOOTIF=01-{}", mac.replace(':', "-")));
    }
    let initrd = vm::build_initramfs_with(
        tools,
        bcd,
        dir.path(),
        &[],
        &[],
        false,
        Some(&script(&cmdline)),
    );
    let boot = vm::boot(tools, &initrd, &nics());
    eprintln!(
        "ramdisk_nics_vm: boot (BOOTIF {bootif:?}) took {:.1} s",
        boot.seconds
    );
    boot.extra.expect("the guest ran bcd ramdisk").0
}

/// The guest's name of NIC `i` (no udev in the ramdisk: the kernel's eth0..eth3, in PCI order).
fn iface(i: usize) -> String {
    format!("eth{i}")
}

#[test]
fn the_boot_nic_first_and_a_lease_that_cannot_reach_the_control_plane_given_back() {
    let Some(tools) = vm::tools_or_skip("ramdisk_nics_vm") else {
        return;
    };
    let bcd = vm::build_bcd();
    // What the guest reaches at 10.0.2.2:<port> through QEMU's user network: any TCP listener
    // stands for the gateway (the reachability check is a TCP connection).
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for c in listener.incoming() {
            drop(c);
        }
    });

    // With BOOTIF naming the third NIC: it is asked first, and only it.
    let log = boot_with(&tools, &bcd, port, Some(MACS[2]));
    let asked: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("asking for a DHCP lease") && l.contains("iface="))
        .collect();
    assert_eq!(asked.len(), 1, "{log}");
    assert!(
        asked[0].contains(&format!("iface={}", iface(2))) && asked[0].contains("why=BOOTIF"),
        "{log}"
    );
    let summary = log
        .lines()
        .find(|l| l.contains("DHCP order: "))
        .unwrap_or_else(|| panic!("no network summary in:\n{log}"));
    eprintln!("ramdisk_nics_vm: with BOOTIF: {summary}");
    assert!(
        summary.contains(&format!("DHCP order: {} (BOOTIF), ", iface(2)))
            && summary.contains(&format!("lease on {}", iface(2)))
            && !summary.contains("left:"),
        "{summary}"
    );

    // Without BOOTIF: by name (all have a link), so the first two lease on the wrong networks,
    // cannot reach the control plane, and are given back; the third's lease is kept.
    let log = boot_with(&tools, &bcd, port, None);
    let summary = log
        .lines()
        .find(|l| l.contains("DHCP order: "))
        .unwrap_or_else(|| panic!("no network summary in:\n{log}"));
    assert!(
        summary.contains(&format!("lease on {}", iface(2))),
        "{summary}"
    );
    for i in [0, 1] {
        assert!(
            summary.contains(&format!("{} (1 runs; last: leased", iface(i)))
                && summary.contains("the control plane did not answer"),
            "{summary}"
        );
    }
    assert!(
        !summary.contains(&format!("{} (1 runs", iface(3))),
        "eth3 was never asked: {summary}"
    );
}
