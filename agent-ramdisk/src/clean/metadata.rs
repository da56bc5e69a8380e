//! The metadata erase: which byte ranges hold what identifies a disk's former content, and
//! zeroing them.
//!
//! The first and last MiB of the disk hold the MBR, both GPT headers and tables (LBA 1 and the
//! last LBA), the end-of-disk superblocks of mdraid 0.90/1.0 and the DDF/vendor RAID anchors of
//! some controllers; the first and last MiB of each partition, the filesystem superblocks
//! (ext2/3/4 at 1 KiB, XFS at 0, btrfs at 64 KiB), LVM labels (sector 1), mdraid 1.1/1.2 (at 0
//! and 4 KiB), bcache (4 KiB) and ZFS labels (two at each end, 256 KiB each). One MiB covers
//! each; ranges are clamped to the disk and merged where they meet.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;

use super::DiskError;
use super::discover::Partition;

/// Bytes zeroed at each end of the disk and of each partition.
pub const END_BYTES: u64 = 1 << 20;
/// Zeroes written per `pwrite`, bytes.
const CHUNK_BYTES: usize = 1 << 20;

/// The ranges to zero on a disk of `size` bytes with `partitions`, sorted, merged, each within
/// `0..size`.
pub fn ranges(partitions: &[Partition], size: u64) -> Vec<Range<u64>> {
    let mut spans: Vec<Range<u64>> = Vec::new();
    let mut both_ends = |start: u64, len: u64| {
        let end = start.saturating_add(len).min(size);
        let start = start.min(end);
        spans.push(start..start.saturating_add(END_BYTES).min(end));
        spans.push(end.saturating_sub(END_BYTES).max(start)..end);
    };
    both_ends(0, size);
    for p in partitions {
        both_ends(p.start_bytes, p.size_bytes);
    }
    spans.retain(|r| !r.is_empty());
    spans.sort_by_key(|r| r.start);
    let mut merged: Vec<Range<u64>> = Vec::new();
    for r in spans {
        match merged.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => merged.push(r),
        }
    }
    merged
}

/// Writes zeroes over `range` of `file`, in 1 MiB writes; `what` names the range in an error.
pub fn zero(file: &File, range: Range<u64>, what: &str) -> Result<(), DiskError> {
    let zeroes = vec![0u8; CHUNK_BYTES];
    let mut at = range.start;
    while at < range.end {
        let n = usize::try_from(range.end - at).map_or(CHUNK_BYTES, |n| n.min(CHUNK_BYTES));
        file.write_all_at(&zeroes[..n], at)
            .map_err(|source| DiskError::Write {
                what: what.to_owned(),
                offset: at,
                source,
            })?;
        at += n as u64;
    }
    Ok(())
}

/// Zeroes every range of [`ranges`] and flushes them to the device; returns the bytes zeroed.
pub fn erase(file: &File, partitions: &[Partition], size: u64) -> Result<u64, DiskError> {
    let mut bytes = 0;
    for r in ranges(partitions, size) {
        bytes += r.end - r.start;
        zero(file, r, "metadata")?;
    }
    // Written through the page cache: only fsync says whether they reached the device.
    file.sync_all()
        .map_err(|source| DiskError::Sync { source })?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn disk(parts: &[(u64, u64)]) -> Vec<Partition> {
        parts
            .iter()
            .enumerate()
            .map(|(i, &(start_bytes, size_bytes))| Partition {
                name: format!("vda{}", i + 1),
                start_bytes,
                size_bytes,
            })
            .collect()
    }

    #[test]
    fn both_ends_of_the_disk_and_of_each_partition_merged_and_clamped() {
        // A 16 MiB disk, partitions at 1..5 MiB and 8..16.5 MiB (past the end: clamped).
        let r = ranges(
            &disk(&[(MIB, 4 * MIB), (8 * MIB, 8 * MIB + MIB / 2)]),
            16 * MIB,
        );
        assert_eq!(
            r,
            vec![
                0..2 * MIB,
                4 * MIB..5 * MIB,
                8 * MIB..9 * MIB,
                15 * MIB..16 * MIB
            ]
        );
        // Smaller than 2 MiB: the whole disk once; a tiny partition: itself.
        assert_eq!(ranges(&disk(&[]), MIB + 7), vec![0..MIB + 7]);
        assert_eq!(
            ranges(&disk(&[(4 * MIB, 4096)]), 10 * MIB),
            vec![0..MIB, 4 * MIB..4 * MIB + 4096, 9 * MIB..10 * MIB]
        );
        assert!(ranges(&disk(&[]), 0).is_empty());
        // A partition starting beyond the disk adds nothing.
        assert_eq!(
            ranges(&disk(&[(20 * MIB, MIB)]), 3 * MIB),
            vec![0..MIB, 2 * MIB..3 * MIB]
        );
    }
}
