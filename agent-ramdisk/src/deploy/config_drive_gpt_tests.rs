//! The config drive on images whose GPT header is hostile: fields gptman would trust in
//! arithmetic or allocations are refused before it reads them, and a backup header pointing
//! somewhere odd is not zeroed there.

use std::io::{Seek, SeekFrom};
use std::os::unix::fs::FileExt;

use super::*;

const MIB: u64 = 1 << 20;
/// Where the test image's one partition starts, and its first bytes.
const PART_LBA: u64 = 2048;
const MARKER: &[u8] = b"BCD-PARTITION-ONE";

/// CRC-32 (IEEE 802.3, reflected), as the GPT's checksums use.
fn crc32(b: &[u8]) -> u32 {
    let mut c = !0u32;
    for &x in b {
        c ^= u32::from(x);
        for _ in 0..8 {
            c = if c & 1 == 1 {
                (c >> 1) ^ 0xedb8_8320
            } else {
                c >> 1
            };
        }
    }
    !c
}

/// A 16 MiB disk holding an 8 MiB GPT image (one partition at LBA 2048, 2 MiB, starting with
/// [`MARKER`]) whose primary header is then changed by `patch` (the header's 92 bytes) and
/// given a correct header CRC again, so gptman accepts it.
fn disk(patch: impl FnOnce(&mut [u8; 92])) -> (tempfile::NamedTempFile, File) {
    let tmp = tempfile::NamedTempFile::new().unwrap();
    let mut f = tmp.reopen().unwrap();
    f.set_len(8 * MIB).unwrap();
    let mut gpt = GPT::new_from(&mut f, 512, [7; 16]).unwrap();
    gpt[1] = GPTPartitionEntry {
        partition_type_guid: BASIC_DATA,
        unique_partition_guid: [9; 16],
        starting_lba: PART_LBA,
        ending_lba: PART_LBA + 4095,
        attribute_bits: 0,
        partition_name: "one".into(),
    };
    gpt.write_into(&mut f).unwrap();
    f.write_all_at(MARKER, PART_LBA * 512).unwrap();
    let mut h = [0u8; 92];
    f.read_exact_at(&mut h, 512).unwrap();
    patch(&mut h);
    h[16..20].fill(0);
    let crc = crc32(&h);
    h[16..20].copy_from_slice(&crc.to_le_bytes());
    f.write_all_at(&h, 512).unwrap();
    // The machine's disk is larger than the image: the config drive goes after it.
    f.set_len(16 * MIB).unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    (tmp, f)
}

fn drive() -> Drive {
    Drive {
        drive: ConfigDrive {
            hostname: "h1".into(),
            ssh_keys: Vec::new(),
            user_data: None,
        },
        instance_id: "i-1".into(),
        deploy_token: None,
    }
}

/// A change to a GPT header's 92 bytes.
type Patch = Box<dyn Fn(&mut [u8; 92])>;

fn set_u32(h: &mut [u8; 92], at: usize, v: u32) {
    h[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn set_u64(h: &mut [u8; 92], at: usize, v: u64) {
    h[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

#[test]
fn the_unpatched_image_takes_its_config_drive() {
    let (_t, mut f) = disk(|_| {});
    assert_eq!(write(&mut f, "vda", &drive()).unwrap(), "vda2");
}

#[test]
fn hostile_entry_counts_sizes_and_array_places_are_refused_without_a_panic() {
    let cases: [(&str, Patch); 5] = [
        // No entries at all (the entry array's CRC of nothing is 0): gptman's sizes underflow.
        (
            "0 partition entries",
            Box::new(|h| {
                set_u32(h, 80, 0);
                set_u32(h, 88, 0);
            }),
        ),
        // Four billion entries: gptman would allocate hundreds of GB for them.
        (
            "4294967295 partition entries",
            Box::new(|h| set_u32(h, 80, u32::MAX)),
        ),
        ("8-byte partition entries", Box::new(|h| set_u32(h, 84, 8))),
        // An array whose byte offset overflows u64.
        (
            "outside the disk",
            Box::new(|h| set_u64(h, 72, u64::MAX / 256)),
        ),
        ("outside the disk", Box::new(|h| set_u64(h, 72, 1 << 40))),
    ];
    for (why, patch) in cases {
        let (_t, mut f) = disk(patch);
        let e = write(&mut f, "vda", &drive()).unwrap_err();
        assert!(
            matches!(&e, ConfigDriveError::NoGpt(m) if m.contains(why)),
            "{why}: {e}"
        );
    }
}

#[test]
fn a_backup_header_pointing_into_a_partition_or_past_u64_is_not_zeroed_there() {
    // 2^55 + 2048 sectors of 512 bytes: 2^64 + 1 MiB, which wraps to the partition's start.
    for backup in [(1u64 << 55) + PART_LBA, PART_LBA, u64::MAX] {
        let (_t, mut f) = disk(|h| set_u64(h, 32, backup));
        assert_eq!(write(&mut f, "vda", &drive()).unwrap(), "vda2", "{backup}");
        let mut b = vec![0u8; MARKER.len()];
        f.read_exact_at(&mut b, PART_LBA * 512).unwrap();
        assert_eq!(
            b, MARKER,
            "backup LBA {backup}: the partition's first sector was zeroed"
        );
    }
}
