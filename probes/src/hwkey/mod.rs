//! The machine's hardware key (DESIGN.md "Hardware key"; spec: `hardwareKey`,
//! `hardwareKeyTrusted`).
//!
//! # Background
//! Fleet tools that trusted firmware identifiers merged different machines into one record:
//! boards ship with `To Be Filled By O.E.M.`, `1234567890` or a placeholder UUID, and BMC USB
//! network functions carry the same MAC on every host. The key must tell machines apart, and must
//! say when it cannot.
//!
//! # Design
//! Candidates: the SMBIOS system UUID, system, baseboard and chassis serials (from the table when
//! readable, else `/sys/class/dmi/id`) and the permanent MAC of each physical NIC. Each is
//! normalized ([`normalize`]) and checked against the junk rules; values equal after normalization
//! count once; a UUID made of ten zero bytes and a MAC counts as that MAC. The key is SHA-256 over
//! the sorted `kind:value` lines of the survivors, one per line with `\n`; it is trusted with at
//! least two. Each survivor's own SHA-256 goes to the control plane too, so a machine whose NIC or
//! board was swapped is still recognised.
//!
//! UUIDs that many machines share are rejected with the rule that caught them: FreeBSD's
//! hostid deny list, `*-ffff-ffff-ffff-ffffffffffff`, one byte repeated, and Dell's form with a
//! blank service tag (see [`normalize::check_uuid`]), in either byte order.
//!
//! # Limitations
//! ETHTOOL_GPERMADDR is asked only on a live root (`/`). Dell derives its system UUID from the
//! service tag (`4c4c4544-…`, "DELL"); a programmed tag's UUID is counted as a separate
//! identifier.

mod cli;
mod render;

/// The identifiers' normalization and junk rules live in the protocol crate: the control plane
/// spells a BMC-reported identifier with the same rules (issue 14, enrollment).
pub use bc_protocol::hwid as normalize;

use bc_protocol::pb::HardwareIdentity;
use sha2::{Digest, Sha256};

use crate::hostroot::HostRoot;
use crate::inventory::nics::{self, NicProbe};
use crate::smbios::{self, SmbiosFacts, SmbiosTable};
use normalize::{Rejection, UuidVerdict};

pub use cli::{HardwareKeyArgs, run};
pub use render::{render_json, render_table};

pub use bc_protocol::hwid::Kind;

/// One candidate identifier and what became of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// What it was read as.
    pub kind: Kind,
    /// Where it was read: `smbios`, `dmi-id`, `nic eth0 (address)`, ...
    pub source: String,
    /// The value as read (absent when unreadable).
    pub raw: Option<String>,
    /// The `kind:value` line it counts as, when kept (a zero-padded UUID counts as `mac:…`).
    pub line: Option<String>,
    /// Why it was dropped, when it was.
    pub rejection: Option<Rejection>,
}

impl Candidate {
    /// True when it counts toward the key.
    pub fn kept(&self) -> bool {
        self.line.is_some()
    }
}

/// The key, whether it is trusted, and every candidate with the reason it was kept or dropped.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HardwareKeyReport {
    /// Where the SMBIOS identifiers came from: `smbios 3.5 (/sys/firmware/dmi/tables)`,
    /// `/sys/class/dmi/id`, a file, or `none`.
    pub identity_source: String,
    pub candidates: Vec<Candidate>,
    /// Sorted, distinct `kind:value` lines of the survivors.
    pub lines: Vec<String>,
    /// Lowercase hex SHA-256 over `lines`; empty when nothing survived.
    pub hardware_key: String,
    /// At least two independent identifiers survived.
    pub trusted: bool,
    /// What could not be read, and why.
    pub notes: Vec<String>,
}

impl HardwareKeyReport {
    /// The wire form: key, trusted, and the sorted per-identifier digests.
    pub fn identity(&self) -> HardwareIdentity {
        let mut digests: Vec<String> = self.lines.iter().map(|l| normalize::digest(l)).collect();
        digests.sort();
        HardwareIdentity {
            hardware_key: self.hardware_key.clone(),
            trusted: self.trusted,
            identifier_digests: digests,
        }
    }
}

/// One value read from firmware.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Read {
    /// Read, through [`crate::hostroot::clean_identifier`], non-empty.
    Value(String),
    /// Not there (no such structure, string index 0, empty file).
    #[default]
    Absent,
    /// There but not readable (permission denied): the reason.
    Unreadable(String),
}

impl Read {
    fn from_opt(v: Option<String>) -> Self {
        v.map_or(Self::Absent, Self::Value)
    }
}

/// The identifiers SMBIOS offers, from the table or from `/sys/class/dmi/id`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DmiIds {
    /// Rendered UUID (`8-4-4-4-12`), by the table's version rule.
    pub system_uuid: Read,
    pub system_serial: Read,
    pub baseboard_serial: Read,
    pub chassis_serial: Read,
}

impl DmiIds {
    /// The identifiers of a decoded table.
    pub fn from_facts(f: &SmbiosFacts) -> Self {
        Self {
            system_uuid: Read::from_opt(f.system_uuid()),
            system_serial: Read::from_opt(f.system_serial.clone()),
            baseboard_serial: Read::from_opt(f.board_serial.clone()),
            chassis_serial: Read::from_opt(f.chassis_serial.clone()),
        }
    }

    /// `/sys/class/dmi/id/{product_uuid,product_serial,board_serial,chassis_serial}` (the kernel
    /// renders the UUID by the same version rule). `None` when the directory is absent.
    pub fn from_sysfs(root: &HostRoot) -> Option<Self> {
        const DIR: &str = "/sys/class/dmi/id";
        if !root.exists(DIR) {
            return None;
        }
        let read = |file: &str| match root.read(format!("{DIR}/{file}")) {
            Ok(b) => Read::from_opt(crate::hostroot::clean_identifier_bytes(&b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Read::Absent,
            Err(e) => Read::Unreadable(format!("{DIR}/{file}: {e}")),
        };
        Some(Self {
            system_uuid: read("product_uuid"),
            system_serial: read("product_serial"),
            baseboard_serial: read("board_serial"),
            chassis_serial: read("chassis_serial"),
        })
    }
}

/// The report for the machine under `root`: SMBIOS from `/sys/firmware/dmi/tables`, else
/// `/sys/class/dmi/id`, plus its NICs. Never fails: what is missing becomes a note.
pub fn report(root: &HostRoot) -> HardwareKeyReport {
    let mut notes = Vec::new();
    let (source, ids) = match smbios::load_sysfs(root) {
        Ok(t) => {
            notes.extend(t.warnings.iter().cloned());
            (
                format!(
                    "smbios {}.{} (/sys/firmware/dmi/tables)",
                    t.version.0, t.version.1
                ),
                DmiIds::from_facts(&t.facts()),
            )
        }
        Err(e) => {
            notes.push(format!("SMBIOS table: {e}"));
            match DmiIds::from_sysfs(root) {
                Some(ids) => ("/sys/class/dmi/id".to_owned(), ids),
                None => {
                    notes.push(
                        "no SMBIOS on this machine: neither /sys/firmware/dmi/tables nor /sys/class/dmi/id".into(),
                    );
                    ("none".to_owned(), DmiIds::default())
                }
            }
        }
    };
    let mut inv_notes = Vec::new();
    let nics = nics::probe(root, &mut inv_notes);
    notes.extend(inv_notes.into_iter().map(|n| n.message));
    evaluate(&source, &ids, &nics, notes)
}

/// The report for a table alone (`bcd hardware-key --smbios FILE`): no NICs.
pub fn report_from_table(table: &SmbiosTable, file: &str) -> HardwareKeyReport {
    let source = format!("smbios {}.{} ({file})", table.version.0, table.version.1);
    evaluate(
        &source,
        &DmiIds::from_facts(&table.facts()),
        &[],
        table.warnings.clone(),
    )
}

/// [`compute`] on tokio's blocking pool (it reads sysfs and SMBIOS files); `Err` says the probe
/// task panicked or was cancelled.
pub async fn compute_off_runtime(root: HostRoot) -> Result<HardwareIdentity, String> {
    tokio::task::spawn_blocking(move || compute(&root))
        .await
        .map_err(|e| e.to_string())
}

/// The machine's hardware identity (what join and inventory send). Cheap: no process spawning.
pub fn compute(root: &HostRoot) -> HardwareIdentity {
    report(root).identity()
}

/// Applies the rules to the candidates: normalization, junk, duplicates, key.
pub fn evaluate(
    identity_source: &str,
    ids: &DmiIds,
    nics: &[NicProbe],
    notes: Vec<String>,
) -> HardwareKeyReport {
    let mut ev = Evaluator::default();
    let src = if identity_source.starts_with("/sys/class/dmi") {
        "dmi-id"
    } else {
        "smbios"
    };
    ev.uuid(src, &ids.system_uuid);
    ev.serial(Kind::SystemSerial, src, &ids.system_serial);
    ev.serial(Kind::BaseboardSerial, src, &ids.baseboard_serial);
    ev.serial(Kind::ChassisSerial, src, &ids.chassis_serial);
    for n in nics {
        ev.nic(n);
    }
    let mut lines: Vec<String> = ev
        .candidates
        .iter()
        .filter_map(|c| c.line.clone())
        .collect();
    lines.sort();
    lines.dedup();
    let hardware_key = if lines.is_empty() {
        String::new()
    } else {
        let mut h = Sha256::new();
        for l in &lines {
            h.update(l.as_bytes());
            h.update(b"\n");
        }
        hex::encode(h.finalize())
    };
    HardwareKeyReport {
        identity_source: identity_source.to_owned(),
        trusted: lines.len() >= 2,
        candidates: ev.candidates,
        lines,
        hardware_key,
        notes,
    }
}

#[derive(Default)]
struct Evaluator {
    candidates: Vec<Candidate>,
    /// Compact value -> description of the candidate that counted it.
    seen: Vec<(String, String)>,
}

impl Evaluator {
    fn push(
        &mut self,
        kind: Kind,
        source: String,
        raw: Option<String>,
        r: Result<(Kind, String), Rejection>,
    ) {
        let (line, rejection) = match r {
            Ok((k, v)) => {
                let c = normalize::compact(&v);
                if let Some((_, first)) = self.seen.iter().find(|(s, _)| *s == c) {
                    (None, Some(Rejection::DuplicateOf(first.clone())))
                } else {
                    self.seen.push((c, format!("{} ({source})", kind.as_str())));
                    (Some(normalize::line(k, &v)), None)
                }
            }
            Err(e) => (None, Some(e)),
        };
        self.candidates.push(Candidate {
            kind,
            source,
            raw,
            line,
            rejection,
        });
    }

    fn uuid(&mut self, src: &str, v: &Read) {
        let r = match v {
            Read::Absent => return,
            Read::Unreadable(why) => Err(Rejection::Unreadable(why.clone())),
            Read::Value(s) => match normalize::check_uuid(s) {
                Ok(UuidVerdict::Uuid(u)) => Ok((Kind::SystemUuid, u)),
                Ok(UuidVerdict::EmbeddedMac(m)) => normalize::check_mac(&m).map(|m| (Kind::Mac, m)),
                Err(e) => Err(e),
            },
        };
        self.push(Kind::SystemUuid, src.to_owned(), value_of(v), r);
    }

    fn serial(&mut self, kind: Kind, src: &str, v: &Read) {
        let r = match v {
            Read::Absent => return,
            Read::Unreadable(why) => Err(Rejection::Unreadable(why.clone())),
            Read::Value(s) => {
                let n = normalize::normalize(s);
                normalize::check_serial(&n).map(|()| (kind, n))
            }
        };
        self.push(kind, src.to_owned(), value_of(v), r);
    }

    fn nic(&mut self, p: &NicProbe) {
        let n = &p.nic;
        let origin = p.perm_source.map_or("address", |s| s.as_str());
        let source = format!("nic {} ({origin})", n.name);
        let raw = n.permanent_mac.clone().or_else(|| n.mac.clone());
        let r = (|| {
            if !n.physical {
                return Err(Rejection::VirtualInterface);
            }
            if let Some(d) = n
                .driver
                .as_deref()
                .filter(|d| normalize::BMC_USB_DRIVERS.contains(d))
            {
                return Err(Rejection::BmcUsbNic(d.to_owned()));
            }
            let Some(v) = raw.as_deref() else {
                return Err(Rejection::Empty);
            };
            let mac = normalize::check_mac(v)?;
            if p.perm_source.is_none() {
                return Err(Rejection::NotPermanent(match p.addr_assign_type {
                    Some(t) => format!("addr_assign_type {t}"),
                    None => "addr_assign_type unreadable".into(),
                }));
            }
            Ok((Kind::Mac, mac))
        })();
        self.push(Kind::Mac, source, raw, r);
    }
}

fn value_of(v: &Read) -> Option<String> {
    match v {
        Read::Value(s) => Some(s.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod field_tests;
#[cfg(test)]
#[path = "hwkey_tests.rs"]
mod tests;
