//! A QEMU virtual machine that boots a real Linux kernel with a ramdisk holding busybox, the
//! `bcd` binary and `lsblk`, runs `bcd inventory -o json` and `lsblk -O -J` once, prints each
//! between markers on the serial console and powers off. The tests compare what the probes read
//! from a real kernel's `/sys` with what QEMU's command line put there and with `lsblk`.
//!
//! What it needs (`.ci/run` installs and exports them; a test without them says so and returns,
//! and fails under `CI=true`):
//! - a kernel: `BC_VM_KERNEL` (a `vmlinuz-<version>` file), else `target/vm/vmlinuz`; its modules
//!   under `<root>/lib/modules/<version>` where `<root>/boot/vmlinuz-<version>` is the kernel's
//!   canonical path (the layout `dpkg-deb -x linux-image-….deb <root>` leaves), with `modules.dep`;
//! - `qemu-system-x86_64` (`BC_QEMU`, else on PATH), a static busybox (`BC_BUSYBOX`, else
//!   `/bin/busybox`), `cpio`, `modprobe` and `ldd` on this machine, `lsblk` at `/usr/bin/lsblk`.
//!
//! The machine is emulated (`-accel tcg,thread=single`): no KVM needed; a boot with the probes
//! takes 15–30 s on 2 busy cores (the test gives its NICs no option ROM: `romfile=`). One TCG
//! thread for all vCPUs, because multi-threaded TCG with 4 vCPU threads on 2 loaded host cores
//! once left the guest in RCU stalls until the limit.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Kernel modules the ramdisk loads (with their dependencies, in `modprobe`'s order). Debian's
/// kernel builds the PCIe port driver and the PCI host bridges in; these are modules there.
pub const MODULES: &[&str] = &[
    "crc64_rocksoft_generic",
    "nvme",
    "virtio_pci",
    "virtio_blk",
    "virtio_scsi",
    "sd_mod",
    // q35's own AHCI controller (ICH9, 00:1f.2) for a SATA disk.
    "ahci",
    "e1000e",
    "virtio_net",
    // /dev/ipmi0 for QEMU's BMC simulator (isa-ipmi-kcs).
    "ipmi_si",
    "ipmi_devintf",
];

/// How long a boot may take before the harness gives up on it (a hung guest, not a slow one).
const BOOT_LIMIT: Duration = Duration::from_secs(300);

/// What is missing to boot the VM, for the skip message.
#[derive(Debug)]
pub struct Missing(pub String);

/// The tools the VM needs, found on this machine.
#[derive(Debug, Clone)]
pub struct VmTools {
    pub kernel: PathBuf,
    pub kernel_version: String,
    /// The directory holding `lib/modules/<kernel_version>`.
    pub modules_root: PathBuf,
    pub qemu: PathBuf,
    pub busybox: PathBuf,
    pub lsblk: PathBuf,
    pub modprobe: PathBuf,
}

fn workspace_root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

fn on_path(name: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn env_path(var: &str) -> Option<PathBuf> {
    std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

impl VmTools {
    /// Finds everything, or says what is missing.
    pub fn find() -> Result<Self, Missing> {
        let kernel =
            env_path("BC_VM_KERNEL").unwrap_or_else(|| workspace_root().join("target/vm/vmlinuz"));
        let canonical = std::fs::canonicalize(&kernel).map_err(|e| {
            Missing(format!(
                "kernel {} ({e}): set BC_VM_KERNEL (.ci/run unpacks Debian's into target/vm)",
                kernel.display()
            ))
        })?;
        let kernel_version = canonical
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("vmlinuz-"))
            .ok_or_else(|| {
                Missing(format!(
                    "{} is not named vmlinuz-<version>",
                    canonical.display()
                ))
            })?
            .to_owned();
        let modules_root = canonical
            .parent()
            .and_then(Path::parent)
            .ok_or_else(|| Missing(format!("no root above {}", canonical.display())))?
            .to_owned();
        let dep = modules_root.join(format!("lib/modules/{kernel_version}/modules.dep"));
        if !dep.is_file() {
            return Err(Missing(format!(
                "{} is missing (run depmod -b {} {kernel_version})",
                dep.display(),
                modules_root.display()
            )));
        }
        let qemu = env_path("BC_QEMU")
            .or_else(|| on_path("qemu-system-x86_64"))
            .ok_or_else(|| Missing("qemu-system-x86_64 (BC_QEMU, or on PATH)".into()))?;
        let busybox = env_path("BC_BUSYBOX").unwrap_or_else(|| PathBuf::from("/bin/busybox"));
        if !busybox.is_file() {
            return Err(Missing(format!(
                "{} (busybox-static; or set BC_BUSYBOX)",
                busybox.display()
            )));
        }
        let lsblk = PathBuf::from("/usr/bin/lsblk");
        let modprobe = on_path("modprobe")
            .or_else(|| {
                ["/usr/sbin/modprobe", "/sbin/modprobe"]
                    .into_iter()
                    .map(PathBuf::from)
                    .find(|p| p.is_file())
            })
            .ok_or_else(|| Missing("modprobe (kmod) is not installed".into()))?;
        for (what, p) in [
            ("lsblk", Some(lsblk.clone())),
            ("cpio", on_path("cpio")),
            ("ldd", on_path("ldd")),
        ] {
            if !p.is_some_and(|p| p.is_file()) {
                return Err(Missing(format!("{what} is not installed")));
            }
        }
        Ok(Self {
            kernel: canonical,
            kernel_version,
            modules_root,
            qemu,
            busybox,
            lsblk,
            modprobe,
        })
    }
}

/// Finds the tools, or — outside CI — prints why the test cannot run and returns `None`;
/// under `CI=true` a missing tool fails the test.
pub fn tools_or_skip(test: &str) -> Option<VmTools> {
    match VmTools::find() {
        Ok(t) => Some(t),
        Err(Missing(m)) => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{test}: cannot boot the VM: {m} (.ci/run installs it)"
            );
            eprintln!("!!! {test}: SKIPPED, cannot boot the VM: {m} (.ci/run installs it)");
            None
        }
    }
}

/// UEFI for a machine ([`bc_metal_sim::firmware`]: Debian's `ovmf`, or `BC_OVMF_CODE` and
/// `BC_OVMF_VARS`), or — outside CI — `None` after saying loudly why the test cannot run;
/// under `CI=true` a missing OVMF fails the test.
pub fn uefi_or_skip(test: &str) -> Option<bc_metal_sim::firmware::Firmware> {
    use bc_metal_sim::firmware::{Firmware, FirmwareKind};
    match Firmware::of(FirmwareKind::Uefi) {
        Ok(f) => Some(f),
        Err(e) => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{test}: cannot boot a UEFI machine: {e} (.ci/run installs it)"
            );
            eprintln!("!!! {test}: SKIPPED, cannot boot a UEFI machine: {e} (.ci/run installs it)");
            None
        }
    }
}

/// Builds `bcd` (only that binary) into this test's target dir and returns its path.
pub fn build_bcd() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .to_owned();
    let target = dir.parent().expect("target dir").to_owned();
    let mut cmd = crate::cargo_command();
    cmd.args(["build", "-p", "bcd", "--bin", "bcd", "--target-dir"])
        .arg(&target)
        .current_dir(workspace_root());
    if dir.file_name().and_then(|n| n.to_str()) == Some("release") {
        cmd.arg("--release");
    }
    let status = cmd.status().expect("running cargo build");
    assert!(status.success(), "building bcd failed");
    dir.join("bcd")
}

/// The shared libraries `ldd` lists for `bin` (absolute paths, the loader included).
fn shared_libs(bin: &Path) -> Vec<PathBuf> {
    let out = Command::new("ldd").arg(bin).output().expect("running ldd");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            l.split_whitespace()
                .find(|w| w.starts_with('/'))
                .map(PathBuf::from)
        })
        .collect()
}

/// The `.ko` files of `MODULES` and their dependencies, each once, in load order.
fn module_files(t: &VmTools) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for m in MODULES {
        let o = Command::new(&t.modprobe)
            .arg("-d")
            .arg(&t.modules_root)
            .args(["-S", &t.kernel_version, "--show-depends", m])
            .output()
            .expect("running modprobe --show-depends");
        let text = String::from_utf8_lossy(&o.stdout);
        // "builtin nvme" lines need nothing; "insmod /path/x.ko" lines are the files.
        for l in text.lines() {
            let mut w = l.split_whitespace();
            if w.next() == Some("insmod")
                && let Some(p) = w.next()
            {
                let p = PathBuf::from(p);
                if !out.contains(&p) {
                    out.push(p);
                }
            }
        }
    }
    out
}

/// The `/init` of the ramdisk. Module loads that fail (e.g. a CPU-specific crypto helper the
/// emulated CPU lacks) are only printed; the markers carry each command's exit status.
fn init_script() -> String {
    r#"#!/bin/sh
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /run /tmp
for m in $(cat /modules.order); do insmod /mod/$m || echo "@@VM insmod $m failed"; done
# disks appear asynchronously after their drivers load: wait (30 s at most) for those expected
i=0
while [ $i -lt 300 ]; do
  missing=0; for d in $(cat /disks.expected); do [ -e /sys/block/$d ] || missing=1; done
  [ $missing = 0 ] && break; sleep 0.1; i=$((i+1))
done
# interfaces whose MAC /nics.up lists are brought up (the others stay down), and given 5 s at
# most to report a carrier
for n in /sys/class/net/*; do
  grep -qx "$(cat $n/address)" /nics.up && ip link set "${n##*/}" up
done
i=0
while [ $i -lt 50 ]; do
  c=0; for n in /sys/class/net/*; do grep -qx "$(cat $n/address)" /nics.up && [ "$(cat $n/carrier 2>/dev/null)" != 1 ] && c=1; done
  [ $c = 0 ] && break; sleep 0.1; i=$((i+1))
done
echo "@@VM uptime $(cut -d' ' -f1 /proc/uptime) block: $(ls /sys/block | tr '\n' ' ')"
echo "@@VM-INVENTORY-BEGIN"
/bin/bcd inventory -o json --log error
echo "@@VM-INVENTORY-END rc=$?"
echo "@@VM-LSBLK-BEGIN"
/bin/lsblk -O -J -b
echo "@@VM-LSBLK-END rc=$?"
if [ -x /capture-sys.sh ]; then
  echo "@@VM-SYS-BEGIN"; /capture-sys.sh; echo "@@VM-SYS-END rc=$?"
fi
if [ -x /extra.sh ]; then
  echo "@@VM-EXTRA-BEGIN"; /extra.sh; echo "@@VM-EXTRA-END rc=$?"
fi
if [ -d /dev/disk/by-path ]; then echo "@@VM by-path: $(ls /dev/disk/by-path)"; else echo "@@VM no /dev/disk/by-path"; fi
echo "@@VM poweroff at $(cut -d' ' -f1 /proc/uptime)"
poweroff -f
"#
    .to_owned()
}

fn copy_into(stage: &Path, src: &Path, dest: &str) {
    let d = stage.join(dest.trim_start_matches('/'));
    std::fs::create_dir_all(d.parent().unwrap()).unwrap();
    std::fs::copy(src, &d).unwrap_or_else(|e| panic!("copying {}: {e}", src.display()));
}

/// Writes `<dir>/initrd.cpio` (newc, uncompressed) and returns its path. The guest waits for the
/// block devices named in `disks` before it runs the probes, and brings up the interfaces whose
/// MAC `nics_up` lists (lowercase; the others stay down). With `capture`, the
/// guest also prints its `/sys` subset (`tests/e2e/vm/capture-sys.sh`, see [`write_sys_tree`]).
pub fn build_initramfs(
    t: &VmTools,
    bcd: &Path,
    dir: &Path,
    disks: &[&str],
    nics_up: &[&str],
    capture: bool,
) -> PathBuf {
    build_initramfs_with(t, bcd, dir, disks, nics_up, capture, None)
}

/// [`build_initramfs`] with `extra`, a shell script the guest runs after the probes (its output
/// between `@@VM-EXTRA-BEGIN` and `@@VM-EXTRA-END rc=<status>`, [`Boot::extra`]).
pub fn build_initramfs_with(
    t: &VmTools,
    bcd: &Path,
    dir: &Path,
    disks: &[&str],
    nics_up: &[&str],
    capture: bool,
    extra: Option<&str>,
) -> PathBuf {
    let stage = dir.join("stage");
    for d in ["bin", "dev", "proc", "sys", "run", "tmp", "mod"] {
        std::fs::create_dir_all(stage.join(d)).unwrap();
    }
    copy_into(&stage, &t.busybox, "/bin/busybox");
    let list = Command::new(&t.busybox).arg("--list").output().unwrap();
    for applet in String::from_utf8_lossy(&list.stdout).lines() {
        if applet != "busybox" {
            std::os::unix::fs::symlink("busybox", stage.join("bin").join(applet)).unwrap();
        }
    }
    copy_into(&stage, bcd, "/bin/bcd");
    copy_into(&stage, &t.lsblk, "/bin/lsblk");
    for bin in [bcd, t.lsblk.as_path()] {
        for lib in shared_libs(bin) {
            copy_into(&stage, &lib, lib.to_str().unwrap());
        }
    }
    let mut order = String::new();
    for ko in module_files(t) {
        let name = ko.file_name().unwrap().to_str().unwrap().to_owned();
        copy_into(&stage, &ko, &format!("/mod/{name}"));
        order.push_str(&name);
        order.push('\n');
    }
    std::fs::write(stage.join("modules.order"), order).unwrap();
    std::fs::write(stage.join("disks.expected"), disks.join("\n") + "\n").unwrap();
    std::fs::write(stage.join("nics.up"), nics_up.join("\n") + "\n").unwrap();
    if capture {
        let script = stage.join("capture-sys.sh");
        copy_into(
            &stage,
            Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/vm/capture-sys.sh")),
            "/capture-sys.sh",
        );
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    if let Some(script) = extra {
        let p = stage.join("extra.sh");
        std::fs::write(&p, format!("#!/bin/sh\nexport PATH=/bin\n{script}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let init = stage.join("init");
    std::fs::write(&init, init_script()).unwrap();
    std::fs::set_permissions(&init, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = dir.join("initrd.cpio");
    let status = Command::new("sh")
        .arg("-c")
        .arg("find . | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0 > \"$1\"")
        .arg("sh")
        .arg(&out)
        .current_dir(&stage)
        .status()
        .expect("running cpio");
    assert!(status.success(), "cpio failed");
    std::fs::remove_dir_all(&stage).unwrap();
    out
}

/// A finished boot: the serial console's text and what the markers enclosed.
#[derive(Debug)]
pub struct Boot {
    pub console: String,
    pub inventory: serde_json::Value,
    pub lsblk: serde_json::Value,
    /// The `/sys` subset the guest printed, when the ramdisk was built with `capture`.
    pub sys: Option<String>,
    /// What the extra script printed and its exit status line (`rc=0`), when there was one.
    pub extra: Option<(String, String)>,
    /// Wall-clock seconds from starting QEMU to its exit (reported, never asserted).
    pub seconds: f64,
}

fn between<'a>(console: &'a str, begin: &str, end: &str) -> Option<(&'a str, &'a str)> {
    let start = console.find(begin)? + begin.len();
    let len = console[start..].find(end)?;
    let rest = &console[start + len + end.len()..];
    let status = rest.lines().next().unwrap_or("").trim();
    Some((&console[start..start + len], status))
}

/// Boots QEMU with `args` (the machine's devices) added to the fixed ones, and parses the
/// console. Panics with the console's text when the guest does not print both documents.
pub fn boot(t: &VmTools, initrd: &Path, args: &[String]) -> Boot {
    let started = Instant::now();
    let mut cmd = Command::new(&t.qemu);
    cmd.args([
        "-machine",
        "q35",
        "-accel",
        "tcg,thread=single",
        "-m",
        "1G",
        "-smp",
        "4",
        "-nographic",
        "-no-reboot",
        "-nic",
        "none",
        "-kernel",
    ])
    .arg(&t.kernel)
    .arg("-initrd")
    .arg(initrd)
    .args(["-append", "console=ttyS0 quiet panic=-1"])
    .args(args);
    eprintln!("vm: {cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", t.qemu.display()));
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = stdout.read_to_end(&mut b);
        b
    });
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if started.elapsed() > BOOT_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            let out = String::from_utf8_lossy(&reader.join().unwrap()).replace('\r', "");
            let lines: Vec<&str> = out.lines().collect();
            let head = lines[..lines.len().min(150)].join("\n");
            let tail = lines[lines.len().saturating_sub(40)..].join("\n");
            panic!(
                "the VM did not power off within {BOOT_LIMIT:?}; console (first 150 lines):\n{head}\n…\n(last 40 lines):\n{tail}"
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let seconds = started.elapsed().as_secs_f64();
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    let console = String::from_utf8_lossy(&reader.join().unwrap()).replace('\r', "");
    assert!(
        status.success(),
        "qemu exited with {status}: {err}\nconsole:\n{console}"
    );
    let doc = |begin: &str, end: &str| -> serde_json::Value {
        let Some((text, rc)) = between(&console, begin, end) else {
            panic!("no {begin} … {end} on the console:\n{console}");
        };
        assert_eq!(
            rc, "rc=0",
            "{begin}: the command failed; console:\n{console}"
        );
        serde_json::from_str(text.trim())
            .unwrap_or_else(|e| panic!("{begin}: not JSON ({e}):\n{text}"))
    };
    let sys = between(&console, "@@VM-SYS-BEGIN\n", "@@VM-SYS-END").map(|(text, rc)| {
        assert_eq!(rc, "rc=0", "capture-sys.sh failed; console:\n{console}");
        text.to_owned()
    });
    let extra = between(&console, "@@VM-EXTRA-BEGIN\n", "@@VM-EXTRA-END")
        .map(|(text, rc)| (text.to_owned(), rc.to_owned()));
    Boot {
        sys,
        extra,
        inventory: doc("@@VM-INVENTORY-BEGIN", "@@VM-INVENTORY-END"),
        lsblk: doc("@@VM-LSBLK-BEGIN", "@@VM-LSBLK-END"),
        console,
        seconds,
    }
}

/// Standard base64 (with padding) to bytes; `None` on anything else.
fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let s = s.trim().as_bytes();
    if !s.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(s.len() / 4 * 3);
    for chunk in s.chunks(4) {
        let pad = chunk.iter().rev().take_while(|&&c| c == b'=').count();
        let mut n = 0u32;
        for &c in &chunk[..4 - pad] {
            n = (n << 6) | val(c)?;
        }
        n <<= 6 * pad as u32;
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..3 - pad]);
    }
    Some(out)
}

/// Recreates, under `dest`, the tree `capture-sys.sh` printed: directories, files with their
/// content, symbolic links with their (relative) targets.
pub fn write_sys_tree(text: &str, dest: &Path) {
    for line in text.lines() {
        let mut w = line.splitn(3, ' ');
        let (Some(kind), Some(path)) = (w.next(), w.next()) else {
            continue;
        };
        let rest = w.next().unwrap_or("");
        let at = dest.join(path.trim_start_matches('/'));
        match kind {
            "D" => std::fs::create_dir_all(&at).unwrap(),
            "F" => {
                std::fs::create_dir_all(at.parent().unwrap()).unwrap();
                let bytes =
                    base64_decode(rest).unwrap_or_else(|| panic!("{path}: bad base64 {rest:?}"));
                std::fs::write(&at, bytes).unwrap();
            }
            "L" => {
                std::fs::create_dir_all(at.parent().unwrap()).unwrap();
                let _ = std::fs::remove_file(&at);
                std::os::unix::fs::symlink(rest, &at).unwrap();
            }
            _ => panic!("capture-sys.sh: unexpected line {line:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64() {
        assert_eq!(super::base64_decode("").unwrap(), b"");
        assert_eq!(super::base64_decode("MQo=").unwrap(), b"1\n");
        assert_eq!(super::base64_decode("QkNOVk1FMA==").unwrap(), b"BCNVME0");
        assert_eq!(super::base64_decode("YWJj").unwrap(), b"abc");
        assert_eq!(super::base64_decode("Y*Jj"), None);
    }
}
