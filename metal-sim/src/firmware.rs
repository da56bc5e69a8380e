//! The machines' firmware (issue 31, rule 12): QEMU's SeaBIOS, or UEFI with Debian's OVMF.
//!
//! Both network-boot with the iPXE that Debian's `ipxe-qemu` gives QEMU's NICs: its ROMs
//! (`/usr/lib/ipxe/qemu/efi-virtio.rom`, QEMU's default `romfile` for `virtio-net-pci`) carry the
//! legacy image SeaBIOS runs and the EFI driver OVMF runs, so a UEFI machine needs only the
//! firmware's two flash images: OVMF's code (read-only, shared) and a copy of its variable store
//! per machine (its NVRAM: boot entries persist across its reboots, as on a real machine).
//!
//! Where OVMF is looked for: `BC_OVMF_CODE` and `BC_OVMF_VARS` (both, when set), else Debian's
//! `ovmf` package, its 4 MiB pair first (`OVMF_CODE_4M.fd`/`OVMF_VARS_4M.fd`), then the 2 MiB
//! one. A code and a vars image must come from the same build: the pairs are never mixed.
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// What went wrong with a machine's firmware.
#[derive(Debug, thiserror::Error)]
pub enum FirmwareError {
    /// `--firmware` was given something else.
    #[error("unknown firmware {0:?}: bios or uefi")]
    Unknown(String),
    /// No OVMF pair was found (the paths looked at are named).
    #[error(
        "UEFI firmware (OVMF) not found: looked for {0}; install Debian's ovmf package, or set BC_OVMF_CODE and BC_OVMF_VARS"
    )]
    OvmfMissing(String),
    /// A machine's variable store could not be made from the template.
    #[error("copying OVMF's variable store {from} to {to}: {source}")]
    Vars {
        from: PathBuf,
        to: PathBuf,
        source: std::io::Error,
    },
}

/// Which firmware a machine boots with, as `--firmware` spells it (`bios`, `uefi`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FirmwareKind {
    /// SeaBIOS, QEMU's default.
    #[default]
    Bios,
    /// OVMF.
    Uefi,
}

impl FromStr for FirmwareKind {
    type Err = FirmwareError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "bios" => Ok(Self::Bios),
            "uefi" => Ok(Self::Uefi),
            _ => Err(FirmwareError::Unknown(s.to_owned())),
        }
    }
}

impl fmt::Display for FirmwareKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Bios => "bios",
            Self::Uefi => "uefi",
        })
    }
}

/// OVMF's flash images: `code` (the firmware, mapped read-only) and `vars` (the template of a
/// machine's variable store, copied once per machine).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ovmf {
    pub code: PathBuf,
    pub vars: PathBuf,
}

/// Debian's `ovmf` pairs, best first.
const DEBIAN_OVMF: &[(&str, &str)] = &[
    (
        "/usr/share/OVMF/OVMF_CODE_4M.fd",
        "/usr/share/OVMF/OVMF_VARS_4M.fd",
    ),
    (
        "/usr/share/OVMF/OVMF_CODE.fd",
        "/usr/share/OVMF/OVMF_VARS.fd",
    ),
];

impl Ovmf {
    /// The pair named by `BC_OVMF_CODE`/`BC_OVMF_VARS`, else Debian's.
    ///
    /// Errors: [`FirmwareError::OvmfMissing`] naming every path looked at.
    pub fn find() -> Result<Self, FirmwareError> {
        let env = |v: &str| {
            std::env::var_os(v)
                .filter(|s| !s.is_empty())
                .map(PathBuf::from)
        };
        let candidates: Vec<(PathBuf, PathBuf)> = match (env("BC_OVMF_CODE"), env("BC_OVMF_VARS")) {
            (Some(code), Some(vars)) => vec![(code, vars)],
            _ => DEBIAN_OVMF
                .iter()
                .map(|(c, v)| (PathBuf::from(c), PathBuf::from(v)))
                .collect(),
        };
        Self::first_present(&candidates)
    }

    fn first_present(candidates: &[(PathBuf, PathBuf)]) -> Result<Self, FirmwareError> {
        candidates
            .iter()
            .find(|(c, v)| c.is_file() && v.is_file())
            .map(|(code, vars)| Self {
                code: code.clone(),
                vars: vars.clone(),
            })
            .ok_or_else(|| {
                FirmwareError::OvmfMissing(
                    candidates
                        .iter()
                        .map(|(c, v)| format!("{} with {}", c.display(), v.display()))
                        .collect::<Vec<_>>()
                        .join(", "),
                )
            })
    }

    /// The machine's own variable store at `path`, copied from the template the first time.
    ///
    /// Errors: [`FirmwareError::Vars`] when the copy fails.
    pub fn machine_vars(&self, path: &Path) -> Result<(), FirmwareError> {
        if path.exists() {
            return Ok(());
        }
        std::fs::copy(&self.vars, path)
            .map(drop)
            .map_err(|source| FirmwareError::Vars {
                from: self.vars.clone(),
                to: path.to_owned(),
                source,
            })
    }
}

/// A machine's firmware, with what it needs found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Firmware {
    /// SeaBIOS.
    #[default]
    Bios,
    /// OVMF, from these images.
    Uefi(Ovmf),
}

impl Firmware {
    /// The firmware of `kind`, finding OVMF for [`FirmwareKind::Uefi`].
    ///
    /// Errors: [`FirmwareError::OvmfMissing`].
    pub fn of(kind: FirmwareKind) -> Result<Self, FirmwareError> {
        Ok(match kind {
            FirmwareKind::Bios => Self::Bios,
            FirmwareKind::Uefi => Self::Uefi(Ovmf::find()?),
        })
    }

    /// Its kind.
    pub fn kind(&self) -> FirmwareKind {
        match self {
            Self::Bios => FirmwareKind::Bios,
            Self::Uefi(_) => FirmwareKind::Uefi,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn kinds_parse_as_the_flag_spells_them() {
        assert_eq!("bios".parse::<FirmwareKind>().unwrap(), FirmwareKind::Bios);
        assert_eq!("UEFI".parse::<FirmwareKind>().unwrap(), FirmwareKind::Uefi);
        let e = "efi".parse::<FirmwareKind>().unwrap_err().to_string();
        assert!(e.contains("\"efi\"") && e.contains("bios or uefi"), "{e}");
        assert_eq!(FirmwareKind::Uefi.to_string(), "uefi");
    }

    #[test]
    fn a_pair_is_taken_whole_and_a_missing_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let (code, vars) = (dir.path().join("CODE.fd"), dir.path().join("VARS.fd"));
        let other_code = dir.path().join("OTHER_CODE.fd");
        std::fs::write(&code, b"code").unwrap();
        std::fs::write(&vars, b"vars-template").unwrap();
        std::fs::write(&other_code, b"code").unwrap();
        // The first pair lacks its vars: never mixed with the second's.
        let missing_vars = dir.path().join("OTHER_VARS.fd");
        let o = Ovmf::first_present(&[
            (other_code.clone(), missing_vars.clone()),
            (code.clone(), vars.clone()),
        ])
        .unwrap();
        assert_eq!(o, Ovmf { code, vars });
        let e = Ovmf::first_present(&[(other_code, missing_vars)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("OTHER_VARS.fd") && e.contains("ovmf"), "{e}");

        // A machine's store is a copy made once: what the guest wrote there stays.
        let store = dir.path().join("m.vars.fd");
        o.machine_vars(&store).unwrap();
        assert_eq!(std::fs::read(&store).unwrap(), b"vars-template");
        std::fs::write(&store, b"written by the guest").unwrap();
        o.machine_vars(&store).unwrap();
        assert_eq!(std::fs::read(&store).unwrap(), b"written by the guest");
    }
}
