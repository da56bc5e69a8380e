//! Issue 32, item 2: `bcd disk clean --device … --mode full` in a QEMU machine (see
//! `bc_e2e::vm`) whose drives answer for real: QEMU's emulated NVMe controller (`-device nvme`)
//! takes or refuses each Format NVM secure-erase setting as its code does, and q35's AHCI disk
//! answers ATA IDENTIFY DEVICE's security words. The fallback chains the ramdisk's cleaning
//! runs (`ses=2 → 1 → 0`, ATA security erase, discard, zeroing) are checked on what the drives
//! said, and the disk images on the host must hold only zeroes afterwards.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bc_e2e::vm;
use serde_json::Value;

const MIB: u64 = 1 << 20;
const FILL: u8 = 0xAB;
const DISKS: &[&str] = &["nvme0n1", "sda"];

/// What the guest runs after the probes: a dry run, then a full clean of each disk, as JSON.
const SCRIPT: &str = r#"
echo "@@DRY"; bcd disk clean --device /dev/nvme0n1 --mode full --dry-run --log error; echo "@@RC $?"
for d in nvme0n1 sda; do
  echo "@@CLEAN $d"; bcd disk clean --device /dev/$d --mode full -o json --log error; echo "@@RC $?"
done
"#;

/// The text the guest printed after `@@<marker>` and before its `@@RC <status>` line.
fn section<'a>(out: &'a str, marker: &str) -> (&'a str, &'a str) {
    let start = out
        .find(&format!("@@{marker}\n"))
        .unwrap_or_else(|| panic!("no @@{marker} in:\n{out}"))
        + marker.len()
        + 3;
    let len = out[start..].find("@@RC ").unwrap();
    let rc = out[start + len + 5..].lines().next().unwrap_or("").trim();
    (&out[start..start + len], rc)
}

fn steps(r: &Value) -> Vec<String> {
    r["disks"][0]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s.as_str().map(str::to_owned))
        .collect()
}

#[test]
fn a_full_clean_through_the_cli_on_qemus_nvme_and_sata_drives() {
    let Some(tools) = vm::tools_or_skip("disk_clean_vm") else {
        return;
    };
    let bcd = vm::build_bcd();
    let dir = tempfile::tempdir().unwrap();
    let img = |n: &str| {
        let p = dir.path().join(format!("{n}.img"));
        std::fs::write(&p, vec![FILL; (64 * MIB) as usize]).unwrap();
        p
    };
    let (nvme, sata) = (img("nv0"), img("sd0"));
    let initrd =
        vm::build_initramfs_with(&tools, &bcd, dir.path(), DISKS, &[], false, Some(SCRIPT));
    let args: Vec<String> = [
        "-drive",
        &format!("if=none,id=nv0,format=raw,file={}", nvme.display()),
        "-device",
        "nvme,serial=BCNVMECLEAN,drive=nv0",
        "-drive",
        &format!("if=none,id=sd0,format=raw,file={}", sata.display()),
        "-device",
        "ide-hd,drive=sd0,bus=ide.0,serial=BCSATACLEAN",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let boot = vm::boot(&tools, &initrd, &args);
    eprintln!(
        "disk_clean_vm: booted, cleaned and powered off in {:.1} s",
        boot.seconds
    );
    let (out, rc) = boot.extra.clone().expect("the guest ran the clean script");
    assert_eq!(rc, "rc=0", "{out}");

    let (dry, dry_rc) = section(&out, "DRY");
    assert_eq!(dry_rc, "0", "{dry}");
    let format_line = dry
        .lines()
        .find(|l| l.trim_start().starts_with("nvmeFormat: "))
        .unwrap_or_else(|| panic!("no nvmeFormat line in the dry run:\n{dry}"))
        .trim()
        .to_owned();
    eprintln!("disk_clean_vm: dry run: {format_line}");

    // NVMe: every setting the controller refused is a step, and the first it took ends the
    // chain; what the dry run read of crypto erase (FNA bit 2) is what the clean acted on.
    let (json, nvme_rc) = section(&out, "CLEAN nvme0n1");
    assert_eq!(nvme_rc, "0", "{json}");
    let r: Value = serde_json::from_str(json.trim()).unwrap_or_else(|e| panic!("{e}: {json}"));
    assert_eq!(r["disks"][0]["outcome"], "cleaned", "{r:#}");
    let s = steps(&r);
    eprintln!("disk_clean_vm: nvme0n1 steps: {s:?}");
    let formats: Vec<&String> = s.iter().filter(|x| x.starts_with("nvmeFormat")).collect();
    let done = formats
        .iter()
        .position(|x| !x.contains("not supported"))
        .unwrap_or_else(|| panic!("no Format NVM setting took: {s:?}"));
    assert_eq!(
        done,
        formats.len() - 1,
        "the chain ends at the first that took: {s:?}"
    );
    assert!(
        formats[..done].iter().all(|x| x.contains("not supported")),
        "{s:?}"
    );
    let crypto_supported = format_line.contains("crypto erase supported");
    assert_eq!(
        formats[0].starts_with("nvmeFormat ses=2: not supported (FNA bit 2 clear)"),
        !crypto_supported,
        "dry run said {format_line:?}; the clean did {s:?}"
    );

    // SATA: QEMU's IDE core answers IDENTIFY; its security words decide the ATA step, and the
    // block path erases the rest.
    let (json, sata_rc) = section(&out, "CLEAN sda");
    assert_eq!(sata_rc, "0", "{json}");
    let r: Value = serde_json::from_str(json.trim()).unwrap_or_else(|e| panic!("{e}: {json}"));
    assert_eq!(r["disks"][0]["outcome"], "cleaned", "{r:#}");
    let s = steps(&r);
    eprintln!("disk_clean_vm: sda steps: {s:?}");
    assert!(s.iter().any(|x| x.starts_with("ataSecureErase")), "{s:?}");
    assert!(
        s.iter()
            .any(|x| x == "zero" || x.starts_with("discard (reads back zeroes")),
        "{s:?}"
    );

    for (name, p) in [("nvme", &nvme), ("sata", &sata)] {
        let b = std::fs::read(p).unwrap();
        let left = b.iter().filter(|x| **x != 0).count();
        assert_eq!(left, 0, "{name}: {left} bytes not erased");
    }
}
