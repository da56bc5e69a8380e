//! The config drive of `image.write`, read back by tools that did not write it: sfdisk for the
//! GPT, fatfs (reading) for the vfat and its files.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::sync::Arc;

use bc_protocol::commands::deploy::{Compression, ConfigDrive};
use bcd_probes::hostroot::HostRoot;

use super::region::Region;
use super::test_server::Serve;
use super::test_utils::{
    MIB, SERIAL, args, dev, fake_root, gpt_image, have_blkid, have_sfdisk, read_at, serve, sha,
};

const KEY: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBcdTestKeyOnlyForTheseTests test@bcd";

fn sfdisk_json(path: &std::path::Path) -> serde_json::Value {
    let out = std::process::Command::new("sfdisk")
        .arg("--json")
        .arg(path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn read_file(fs: &fatfs::FileSystem<&mut Region<'_>>, name: &str) -> String {
    let mut s = String::new();
    fs.root_dir()
        .open_file(name)
        .unwrap()
        .read_to_string(&mut s)
        .unwrap();
    s
}

/// `blkid -p` of bytes `start..start + len` of `disk`, `KEY=value` lines.
fn blkid(disk: &std::path::Path, start: u64, len: u64) -> String {
    let out = std::process::Command::new("blkid")
        .args([
            "-p",
            "-o",
            "export",
            "-O",
            &start.to_string(),
            "-S",
            &len.to_string(),
        ])
        .arg(disk)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_config_drive_is_a_cidata_vfat_in_a_new_partition_of_a_gpt_moved_to_the_disk_end() {
    if !have_sfdisk() || !have_blkid() {
        return;
    }
    let _one = SERIAL.lock().await;
    let img = Arc::new(gpt_image(b"BCD-MARKER-cfg"));
    let url = serve("/img.raw", Serve::Bytes(img.clone())).await;
    let root = fake_root(&[("vda", 64 * MIB, "QM00001")]);
    let mut a = args(url, sha(&img), Compression::None);
    a.config_drive = Some(ConfigDrive {
        hostname: "node-7".into(),
        ssh_keys: vec![KEY.into()],
        user_data: None,
    });
    a.instance_id = Some("node_7-deploy-1".into());
    a.deploy_token = Some("deploy_abc.secret".into());
    let r = super::image_write(&HostRoot::new(root.path()), a)
        .await
        .unwrap();
    assert_eq!(r.config_drive_partition.as_deref(), Some("vda3"));
    let disk = dev(root.path(), "vda");
    // The image itself is untouched where it had data.
    assert_eq!(read_at(&disk, 2 * MIB, 14), b"BCD-MARKER-cfg");

    // Both headers, their CRCs and the entries, as util-linux checks them.
    let verify = std::process::Command::new("sfdisk")
        .arg("--verify")
        .arg(&disk)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&verify.stdout);
    assert!(
        verify.status.success() && said.contains("No errors detected"),
        "{said}"
    );
    let t = &sfdisk_json(&disk)["partitiontable"];
    assert_eq!(t["label"], "gpt", "{t}");
    let sectors = 64 * MIB / 512;
    // sfdisk reports the last usable LBA from the primary header: the real disk's, not the
    // image's (6 MiB).
    assert_eq!(t["lastlba"], sectors - 34, "{t}");
    let parts = t["partitions"].as_array().unwrap();
    assert_eq!(parts.len(), 3, "{t}");
    let p3 = &parts[2];
    assert!(p3["node"].as_str().unwrap().ends_with("vda3"), "{p3}");
    assert_eq!(p3["name"], "cidata", "{p3}");
    // Right after partition 2 (2 MiB + 2 MiB), 1 MiB aligned; 64 MiB does not fit there on a
    // 64 MiB disk, so it runs to the last usable LBA.
    assert_eq!(p3["start"], 4 * MIB / 512, "{p3}");
    assert_eq!(p3["size"], sectors - 33 - 4 * MIB / 512, "{p3}");
    // The backup header is at the disk's last LBA; the image's old one is gone.
    assert_eq!(&read_at(&disk, 64 * MIB - 512, 8), b"EFI PART");
    assert!(read_at(&disk, 6 * MIB - 512, 512).iter().all(|b| *b == 0));

    let start = p3["start"].as_u64().unwrap() * 512;
    let len = p3["size"].as_u64().unwrap() * 512;
    // libblkid is what cloud-init finds the drive with (`blkid -tLABEL=cidata`).
    let probe = blkid(&disk, start, len);
    assert!(
        probe.contains("TYPE=vfat") && probe.contains("LABEL=cidata"),
        "{probe}"
    );
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&disk)
        .unwrap();
    let mut region = Region::new(&mut f, start, len);
    let fs = fatfs::FileSystem::new(&mut region, fatfs::FsOptions::new()).unwrap();
    assert_eq!(fs.volume_label(), "cidata");
    let meta = read_file(&fs, "meta-data");
    assert!(meta.contains("local-hostname: \"node-7\""), "{meta}");
    assert!(meta.contains("instance-id: \"node_7-deploy-1\""), "{meta}");
    assert!(
        meta.contains(&format!("public-keys:\n  - \"{KEY}\"")),
        "{meta}"
    );
    let user = read_file(&fs, "user-data");
    assert!(user.starts_with("#cloud-config\n"), "{user}");
    assert!(
        user.contains(&format!("ssh_authorized_keys:\n  - \"{KEY}\"")),
        "{user}"
    );
    assert!(user.contains("hostname: \"node-7\""), "{user}");
    assert_eq!(
        read_file(&fs, super::config_drive::JOIN_TOKEN_FILE),
        "deploy_abc.secret\n"
    );
}
