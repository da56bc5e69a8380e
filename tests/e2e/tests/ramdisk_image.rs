//! `packaging/ramdisk/build.sh` is reproducible: two builds from the same inputs into two
//! directories give the same bytes. Also checks what the image holds and its size goal.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use bc_e2e::ramdisk;

/// The compressed image's size goal (40 MiB): it is fetched over iPXE's HTTP by every machine.
const MAX_COMPRESSED: u64 = 40 << 20;

#[test]
fn two_builds_from_the_same_inputs_are_identical() {
    let Some(t) = ramdisk::tools_or_skip("ramdisk_image") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    // One copy of the input: the target dir's bcd may be relinked meanwhile by another build of
    // this workspace (a different feature set), and the test is about build.sh, not cargo.
    let bcd = tmp.path().join("bcd");
    std::fs::copy(bc_e2e::vm::build_bcd(), &bcd).unwrap();
    let a = ramdisk::build_image(&t, &bcd, &tmp.path().join("a"));
    let b = ramdisk::build_image(&t, &bcd, &tmp.path().join("b"));
    for (x, y) in [(&a.initrd, &b.initrd), (&a.kernel, &b.kernel)] {
        let (bx, by) = (std::fs::read(x).unwrap(), std::fs::read(y).unwrap());
        assert!(bx == by, "{} and {} differ", x.display(), y.display());
    }
    let size = std::fs::metadata(&a.initrd).unwrap().len();
    assert!(
        size <= MAX_COMPRESSED,
        "initrd.img is {size} bytes, over the {MAX_COMPRESSED} goal"
    );

    // What is in it: init, busybox with modprobe and udhcpc, bcd, the hook, depmod's index and
    // the NIC and disk drivers at their paths.
    let list = Command::new("sh")
        .arg("-c")
        .arg("gzip -dc \"$1\" | cpio -it --quiet")
        .arg("sh")
        .arg(&a.initrd)
        .output()
        .unwrap();
    assert!(list.status.success());
    let list = String::from_utf8_lossy(&list.stdout);
    let kver = &t.kernel_version;
    for want in [
        "init".to_owned(),
        "bin/bcd".to_owned(),
        "bin/modprobe".to_owned(),
        "bin/udhcpc".to_owned(),
        "sbin".to_owned(),
        "etc/udhcpc.sh".to_owned(),
        format!("lib/modules/{kver}/modules.dep"),
        format!("lib/modules/{kver}/kernel/drivers/net/virtio_net.ko"),
        format!("lib/modules/{kver}/kernel/drivers/nvme/host/nvme.ko"),
    ]
    .into_iter()
    .chain(rescue_files())
    .chain(qcow2_files())
    {
        assert!(
            list.lines().any(|l| l.trim_start_matches("./") == want),
            "{want} is not in the image"
        );
    }
}

/// image.write's qcow2 converter, in the image when qemu-utils is installed (always in CI).
fn qcow2_files() -> Vec<String> {
    let installed = std::path::Path::new("/usr/bin/qemu-img").exists();
    if !installed && std::env::var("CI").as_deref() != Ok("true") {
        eprintln!("!!! ramdisk_image: qemu-utils is not installed: the image writes no qcow2");
        return Vec::new();
    }
    vec!["usr/bin/qemu-img".to_owned()]
}

/// rescue.start's files, in the image when dropbear-bin is installed (always in CI).
fn rescue_files() -> Vec<String> {
    let installed = std::path::Path::new("/usr/sbin/dropbear").exists();
    if !installed && std::env::var("CI").as_deref() != Ok("true") {
        eprintln!("!!! ramdisk_image: dropbear-bin is not installed: the image has no rescue");
        return Vec::new();
    }
    [
        "usr/sbin/dropbear",
        "usr/bin/dropbearkey",
        "etc/passwd",
        "root",
    ]
    .map(str::to_owned)
    .into()
}
