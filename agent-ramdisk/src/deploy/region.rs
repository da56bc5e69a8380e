//! A byte range of a file (a partition of a disk) as a file of its own: reads, writes and
//! seeks stay inside `start..start + len`, so a filesystem library formats the partition
//! without knowing where it sits.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};

/// Zeroes written per call by [`Region::zero`], bytes.
const ZERO_CHUNK: usize = 1 << 20;

/// Bytes `start..start + len` of a file.
#[derive(Debug)]
pub struct Region<'a> {
    file: &'a mut File,
    start: u64,
    len: u64,
    pos: u64,
}

impl<'a> Region<'a> {
    /// The `len` bytes of `file` from `start`, positioned at 0.
    pub fn new(file: &'a mut File, start: u64, len: u64) -> Self {
        Self {
            file,
            start,
            len,
            pos: 0,
        }
    }

    /// Writes zeros over the whole region and seeks back to 0.
    pub fn zero(&mut self) -> io::Result<()> {
        let zeros = vec![0u8; ZERO_CHUNK];
        self.pos = 0;
        while self.pos < self.len {
            let n = usize::try_from(self.len - self.pos).map_or(ZERO_CHUNK, |r| r.min(ZERO_CHUNK));
            self.write_all(&zeros[..n])?;
        }
        self.pos = 0;
        Ok(())
    }

    /// How many of `want` bytes fit before the region's end, and positions the file there.
    fn at(&mut self, want: usize) -> io::Result<usize> {
        let left = self.len.saturating_sub(self.pos);
        let n = usize::try_from(left).map_or(want, |l| l.min(want));
        self.file.seek(SeekFrom::Start(self.start + self.pos))?;
        Ok(n)
    }
}

impl Read for Region<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.at(buf.len())?;
        let k = self.file.read(&mut buf[..n])?;
        self.pos += k as u64;
        Ok(k)
    }
}

impl Write for Region<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.at(buf.len())?;
        if n == 0 && !buf.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "write past the end of the partition",
            ));
        }
        let k = self.file.write(&buf[..n])?;
        self.pos += k as u64;
        Ok(k)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

impl Seek for Region<'_> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let target = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::End(d) => self.len.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        match target {
            Some(p) if p <= self.len => {
                self.pos = p;
                Ok(p)
            }
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "seek outside the partition",
            )),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_writes_stay_inside() {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&[7u8; 64]).unwrap();
        let mut r = Region::new(&mut f, 16, 16);
        assert_eq!(r.seek(SeekFrom::End(0)).unwrap(), 16);
        r.seek(SeekFrom::Start(8)).unwrap();
        assert_eq!(r.write(&[1u8; 32]).unwrap(), 8);
        assert!(r.write(&[1u8]).is_err());
        assert!(r.seek(SeekFrom::Start(17)).is_err());
        r.seek(SeekFrom::Start(0)).unwrap();
        let mut back = Vec::new();
        r.read_to_end(&mut back).unwrap();
        assert_eq!(back, [[7u8; 8], [1u8; 8]].concat());
        let mut all = Vec::new();
        f.seek(SeekFrom::Start(0)).unwrap();
        f.read_to_end(&mut all).unwrap();
        assert_eq!(&all[..24], &[7u8; 24][..]);
        assert_eq!(&all[24..32], &[1u8; 8][..]);
        assert_eq!(&all[32..], &[7u8; 32][..]);
    }
}
