//! The partitions written on the disk itself, for the metadata erase: the kernel's view in
//! sysfs may lack them (a kernel built without the partition parsers, a table the kernel has
//! not re-read, a loop device attached without `-P`), and a filesystem in a partition the
//! kernel does not list must lose its superblocks too.
//!
//! Read: the GPT (UEFI Specification 2.10, 5.3: header at LBA 1, else the backup header at
//! the last LBA, `EFI PART` signature, the partition entry array it points to) and the MBR
//! (four primary entries at byte 446 with `55 AA` at 510, following extended partitions'
//! chain of EBRs). CRCs are not checked: a damaged table whose entries still point somewhere
//! is better erased at those places too; entries are clamped to the disk by the caller.

use std::fs::File;
use std::os::unix::fs::FileExt;

use super::discover::Partition;

/// `EFI PART`.
const GPT_SIGNATURE: &[u8; 8] = b"EFI PART";
/// At most this many GPT entries or EBRs are read (the usual array holds 128).
const MAX_ENTRIES: u64 = 1024;
/// MBR types of extended partitions (CHS, LBA, Linux).
const EXTENDED: [u8; 3] = [0x05, 0x0f, 0x85];
/// MBR type of a GPT's protective entry.
const PROTECTIVE: u8 = 0xee;

/// The partitions in the GPT, else in the MBR, of the disk read through `file` (`size` bytes,
/// `lbs`-byte logical blocks); none when neither is there or readable.
pub fn read(file: &File, size: u64, lbs: u64) -> Vec<Partition> {
    let lbs = lbs.max(512);
    let last = (size / lbs).saturating_sub(1);
    [1, last]
        .into_iter()
        .find_map(|lba| gpt(file, lba, lbs))
        .unwrap_or_else(|| mbr(file, lbs))
}

fn read_at(file: &File, at: u64, len: usize) -> Option<Vec<u8>> {
    let mut b = vec![0u8; len];
    file.read_exact_at(&mut b, at).ok()?;
    Some(b)
}

fn u32_at(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, |s| u64::from(u32::from_le_bytes(s)))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

/// The entries of the GPT whose header is at `header_lba`, if it has one.
fn gpt(file: &File, header_lba: u64, lbs: u64) -> Option<Vec<Partition>> {
    let h = read_at(file, header_lba.checked_mul(lbs)?, 92)?;
    if &h[..8] != GPT_SIGNATURE {
        return None;
    }
    let entries_lba = u64_at(&h, 72);
    let count = u32_at(&h, 80).min(MAX_ENTRIES);
    let entry_bytes = u32_at(&h, 84);
    if !(128..=4096).contains(&entry_bytes) {
        return None;
    }
    let array = read_at(
        file,
        entries_lba.checked_mul(lbs)?,
        usize::try_from(count * entry_bytes).ok()?,
    )?;
    let parts = array
        .chunks_exact(usize::try_from(entry_bytes).ok()?)
        .enumerate()
        .filter(|(_, e)| e[..16].iter().any(|&b| b != 0))
        .filter_map(|(i, e)| {
            let (first, last) = (u64_at(e, 32), u64_at(e, 40));
            (last >= first).then(|| Partition {
                name: format!("gpt{}", i + 1),
                start_bytes: first.saturating_mul(lbs),
                // `last` may be u64::MAX: the count of LBAs saturates instead of wrapping.
                size_bytes: (last - first).saturating_add(1).saturating_mul(lbs),
            })
        })
        .collect();
    Some(parts)
}

/// The MBR's primary entries (a GPT's protective one left out) and the logical partitions of
/// its extended one.
fn mbr(file: &File, lbs: u64) -> Vec<Partition> {
    let mut out = Vec::new();
    let Some(sector) = read_at(file, 0, 512).filter(|s| s[510..] == [0x55, 0xaa]) else {
        return out;
    };
    for (i, e) in sector[446..510].chunks_exact(16).enumerate() {
        let (kind, start, count) = (e[4], u32_at(e, 8), u32_at(e, 12));
        if kind == 0 || kind == PROTECTIVE || count == 0 {
            continue;
        }
        out.push(Partition {
            name: format!("mbr{}", i + 1),
            start_bytes: start.saturating_mul(lbs),
            size_bytes: count.saturating_mul(lbs),
        });
        if EXTENDED.contains(&kind) {
            logical(file, start, lbs, &mut out);
        }
    }
    out
}

/// The chain of EBRs of the extended partition at `ext_start` (LBA): each holds one logical
/// partition (relative to itself) and the next EBR (relative to `ext_start`).
fn logical(file: &File, ext_start: u64, lbs: u64, out: &mut Vec<Partition>) {
    let mut ebr = ext_start;
    for n in 0..MAX_ENTRIES {
        let Some(s) =
            read_at(file, ebr.saturating_mul(lbs), 512).filter(|s| s[510..] == [0x55, 0xaa])
        else {
            return;
        };
        let (start, count) = (u32_at(&s, 446 + 8), u32_at(&s, 446 + 12));
        if count > 0 {
            out.push(Partition {
                name: format!("mbr{}", n + 5),
                start_bytes: (ebr + start).saturating_mul(lbs),
                size_bytes: count.saturating_mul(lbs),
            });
        }
        let next = u32_at(&s, 462 + 8);
        if next == 0 || ext_start + next <= ebr {
            return;
        }
        ebr = ext_start + next;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A disk of `sectors` 512-byte sectors with a GPT header at LBA 1 whose entry array (at
    /// LBA 2, 128-byte entries) holds `entries` as (first LBA, last LBA).
    fn gpt_disk(sectors: u64, entries: &[(u64, u64)]) -> tempfile::NamedTempFile {
        let tmp = tempfile::NamedTempFile::new().unwrap();
        let f = tmp.as_file();
        f.set_len(sectors * 512).unwrap();
        let mut h = [0u8; 92];
        h[..8].copy_from_slice(GPT_SIGNATURE);
        h[72..80].copy_from_slice(&2u64.to_le_bytes());
        h[80..84].copy_from_slice(&u32::try_from(entries.len()).unwrap().to_le_bytes());
        h[84..88].copy_from_slice(&128u32.to_le_bytes());
        f.write_all_at(&h, 512).unwrap();
        for (i, &(first, last)) in entries.iter().enumerate() {
            let mut e = [0u8; 128];
            e[..16].fill(0xaa);
            e[32..40].copy_from_slice(&first.to_le_bytes());
            e[40..48].copy_from_slice(&last.to_le_bytes());
            f.write_all_at(&e, 1024 + 128 * i as u64).unwrap();
        }
        tmp
    }

    #[test]
    fn gpt_entries_with_lbas_at_the_end_of_u64_neither_panic_nor_vanish() {
        let t = gpt_disk(64, &[(0, u64::MAX), (u64::MAX, u64::MAX), (5, 4), (34, 40)]);
        let parts = read(t.as_file(), 64 * 512, 512);
        let got: Vec<(u64, u64)> = parts
            .iter()
            .map(|p| (p.start_bytes, p.size_bytes))
            .collect();
        assert_eq!(
            got,
            [
                // The whole of u64's LBAs: its size saturates, so the caller clamps it to the
                // disk and still zeroes its first MiB.
                (0, u64::MAX),
                (u64::MAX, 512),
                (34 * 512, 7 * 512),
            ]
        );
    }
}
