//! SMBIOS tables: loading (sysfs, `dmidecode --dump-bin` files, raw tables) and the facts the
//! hardware key and the inventory read from them.
//!
//! # Design
//! smbios-lib splits the table into structures and decodes the typed ones; this module finds the
//! table and its version (from the entry point, see [`entry`]) and turns the structures into plain
//! [`SmbiosFacts`]. Strings that are missing or carry a bad string index become `None`: an
//! error's text is never a value (it would end up hashed into the hardware key).
//!
//! A structure that runs past the length the entry point announced is not decoded and gets a
//! warning, as dmidecode prints `<TRUNCATED>` for it ([`layout`]).
//!
//! # Limitations
//! Only the first structure of types 0, 1 and 3 is read; of the type 2 structures (blades list
//! several), the one whose feature flags say "hosting board", else the first.

pub mod entry;
mod facts;
pub mod layout;

use std::path::{Path, PathBuf};

use smbioslib::{SMBiosData, SMBiosVersion};

use crate::hostroot::HostRoot;

pub use facts::{SmbiosFacts, render_uuid};

/// Where the sysfs copies of the entry point and the table live.
pub const SYS_ENTRY_POINT: &str = "/sys/firmware/dmi/tables/smbios_entry_point";
/// The structure table as the kernel exports it.
pub const SYS_TABLE: &str = "/sys/firmware/dmi/tables/DMI";

/// Version assumed for a raw table given without one: the fixtures and current machines are 3.x,
/// and 2.6+ only changes how the UUID is rendered.
pub const DEFAULT_RAW_VERSION: (u8, u8) = (3, 0);

/// Why an SMBIOS table could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum SmbiosError {
    /// Reading a file failed.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The entry point is missing fields or has no anchor.
    #[error("bad entry point: {0}")]
    BadEntryPoint(String),
    /// The entry point points outside the file.
    #[error("table at offset {offset} is outside the {file_len}-byte file")]
    TableOutOfFile { offset: u64, file_len: usize },
    /// Not one whole structure could be read.
    #[error("no SMBIOS structures in {0} bytes of table")]
    NoStructures(usize),
    /// A `--smbios-version` that is not `MAJOR.MINOR`.
    #[error("bad SMBIOS version {0:?}: want MAJOR.MINOR, e.g. 3.3")]
    BadVersion(String),
}

/// A loaded table and its version.
#[derive(Debug)]
pub struct SmbiosTable {
    /// `(major, minor)`.
    pub version: (u8, u8),
    /// True when the version was not known and [`DEFAULT_RAW_VERSION`] was assumed.
    pub version_assumed: bool,
    /// Problems that did not stop the load (bad checksum, table shorter than announced).
    pub warnings: Vec<String>,
    data: SMBiosData,
}

impl SmbiosTable {
    /// The structures, as smbios-lib decoded them.
    pub fn data(&self) -> &SMBiosData {
        &self.data
    }

    /// Plain facts from the table (types 0, 1, 2, 3, 17).
    pub fn facts(&self) -> SmbiosFacts {
        facts::extract(&self.data, self.version)
    }
}

/// Parses `MAJOR.MINOR` (`3.3`).
pub fn parse_version(s: &str) -> Result<(u8, u8), SmbiosError> {
    let bad = || SmbiosError::BadVersion(s.to_owned());
    let (a, b) = s.trim().split_once('.').ok_or_else(bad)?;
    Ok((a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?))
}

/// A raw structure table (no entry point) of a known version, or [`DEFAULT_RAW_VERSION`].
pub fn from_raw_table(
    bytes: Vec<u8>,
    version: Option<(u8, u8)>,
) -> Result<SmbiosTable, SmbiosError> {
    let len = bytes.len();
    let (v, assumed) = match version {
        Some(v) => (v, false),
        None => (DEFAULT_RAW_VERSION, true),
    };
    let data = SMBiosData::from_vec_and_version(bytes, Some(SMBiosVersion::new(v.0, v.1, 0)));
    if data.iter().next().is_none() {
        return Err(SmbiosError::NoStructures(len));
    }
    let mut warnings = Vec::new();
    if assumed {
        warnings.push(format!(
            "raw table without a version: assumed SMBIOS {}.{}",
            v.0, v.1
        ));
    }
    Ok(SmbiosTable {
        version: v,
        version_assumed: assumed,
        warnings,
        data,
    })
}

/// A file that holds an entry point at offset 0 and the table at the address it names
/// (`dmidecode --dump-bin` writes the table at 0x20 and patches the address to match).
pub fn from_dump_bin(bytes: &[u8]) -> Result<SmbiosTable, SmbiosError> {
    let ep = entry::parse(bytes)?;
    let start = usize::try_from(ep.table_address)
        .ok()
        .filter(|s| *s < bytes.len())
        .ok_or(SmbiosError::TableOutOfFile {
            offset: ep.table_address,
            file_len: bytes.len(),
        })?;
    let end = start.saturating_add(ep.table_len).min(bytes.len());
    let mut t = from_raw_table(bytes[start..end].to_vec(), Some(ep.version))?;
    add_entry_warnings(&mut t, &ep, end - start);
    // The whole rest of the file: a structure that goes on past the announced length is whole
    // there, and the note can say where it ends.
    t.warnings
        .extend(layout::notes(&bytes[start..], Some(ep.table_len)));
    Ok(t)
}

fn add_entry_warnings(t: &mut SmbiosTable, ep: &entry::EntryPoint, got: usize) {
    if !ep.checksum_ok {
        t.warnings
            .push("entry point checksum does not add up".into());
    }
    if got < ep.table_len && ep.version.0 < 3 {
        t.warnings.push(format!(
            "table is {got} bytes, the entry point announced {}",
            ep.table_len
        ));
    }
}

/// A file given on the command line: a `--dump-bin` image when it starts with an anchor, else
/// a raw table of `version`.
pub fn load_file(path: &Path, version: Option<(u8, u8)>) -> Result<SmbiosTable, SmbiosError> {
    let bytes = std::fs::read(path).map_err(|source| SmbiosError::Io {
        path: path.to_owned(),
        source,
    })?;
    if entry::has_anchor(&bytes) && version.is_none() {
        from_dump_bin(&bytes)
    } else {
        from_raw_table(bytes, version)
    }
}

/// The machine's table from `<root>/sys/firmware/dmi/tables` (entry point gives the version).
pub fn load_sysfs(root: &HostRoot) -> Result<SmbiosTable, SmbiosError> {
    let io = |p: &str| {
        let path = root.path(p);
        move |source| SmbiosError::Io { path, source }
    };
    let ep_bytes = root.read(SYS_ENTRY_POINT).map_err(io(SYS_ENTRY_POINT))?;
    let ep = entry::parse(&ep_bytes)?;
    let mut table = root.read(SYS_TABLE).map_err(io(SYS_TABLE))?;
    let got = table.len();
    let notes = layout::notes(&table, Some(ep.table_len));
    // The kernel exports exactly the announced length; a longer file (a copied tree) holds
    // nothing of the table past it.
    table.truncate(ep.table_len);
    let mut t = from_raw_table(table, Some(ep.version))?;
    add_entry_warnings(&mut t, &ep, got);
    t.warnings.extend(notes);
    Ok(t)
}

#[cfg(test)]
#[path = "smbios_tests.rs"]
mod tests;
