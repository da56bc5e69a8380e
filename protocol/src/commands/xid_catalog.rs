//! NVIDIA's XID catalog as data: every Xid the catalog lists, its mnemonic, the catalog's
//! immediate action and bcd's resolution bucket (`xid_catalog.csv`, included at build time, its
//! first lines saying which catalog and version it follows).
//!
//! The buckets are the actions an operator has: ignore the Xid, restart the application, reset
//! the GPU, reboot the node, or drain the node and have a person service it; XID 154 is the one
//! whose action is the one it announces. [`super::xid::XidClass::of`] reads the bucket of an Xid
//! here; an Xid the catalog does not list is `unknown`.

use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

/// The catalog file: a version line, a header line, one line per Xid.
pub const CATALOG_CSV: &str = include_str!("xid_catalog.csv");

/// What bcd does about an Xid, from the catalog's immediate action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Bucket {
    /// Nothing (`IGNORE`, and `WORKFLOW_XID_45`: the cleanup after another Xid, which carries
    /// the action).
    Ignore,
    /// The application's fault: restart it (`RESTART_APP`, `CHECK_UVM`).
    RestartApp,
    /// Reset the GPU (`RESET_GPU`, `WORKFLOW_XID_48`, the NVLink workflows).
    ResetGpu,
    /// Reboot the node (`RESTART_BM`, `RESTART_VM`).
    RebootNode,
    /// Drain the node and have a person look (`CONTACT_SUPPORT` / `UNEXPECTED_ERR_REPORT_ISSUE`,
    /// `CHECK_MECHANICALS`, `UPDATE_SWFW`).
    DrainAndService,
    /// XID 154: the action it announces.
    Announced,
}

impl Bucket {
    /// The spelling in the catalog file and JSON (`resetGpu`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ignore => "ignore",
            Self::RestartApp => "restartApp",
            Self::ResetGpu => "resetGpu",
            Self::RebootNode => "rebootNode",
            Self::DrainAndService => "drainAndService",
            Self::Announced => "announced",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        [
            Self::Ignore,
            Self::RestartApp,
            Self::ResetGpu,
            Self::RebootNode,
            Self::DrainAndService,
            Self::Announced,
        ]
        .into_iter()
        .find(|b| b.as_str() == s)
    }
}

/// One Xid of the catalog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// The Xid number.
    pub xid: u64,
    /// The driver's mnemonic (`ROBUST_CHANNEL_GPU_ECC_DBE`); empty where the catalog has none.
    pub mnemonic: &'static str,
    /// The catalog's immediate action (`RESET_GPU`, `WORKFLOW_XID_48`).
    pub catalog_action: &'static str,
    /// bcd's bucket for it.
    pub bucket: Bucket,
    /// A few words for people; empty where the mnemonic says it.
    pub description: &'static str,
}

impl Entry {
    /// The description, else the mnemonic; `None` when the catalog has neither.
    pub fn words(&self) -> Option<&'static str> {
        [self.description, self.mnemonic]
            .into_iter()
            .find(|s| !s.is_empty())
    }
}

/// The catalog, parsed once.
#[derive(Debug)]
pub struct Catalog {
    /// The version line's value.
    pub version: &'static str,
    /// Every Xid, in the file's order (ascending).
    pub entries: Vec<Entry>,
    /// Lines that did not parse (line number, text); a test keeps this empty.
    pub rejected: Vec<(usize, &'static str)>,
}

impl Catalog {
    /// The entry of `xid`.
    pub fn get(&self, xid: u64) -> Option<&Entry> {
        self.entries
            .binary_search_by_key(&xid, |e| e.xid)
            .ok()
            .and_then(|i| self.entries.get(i))
    }
}

/// The catalog compiled into bcd.
pub fn catalog() -> &'static Catalog {
    static CATALOG: OnceLock<Catalog> = OnceLock::new();
    CATALOG.get_or_init(|| parse(CATALOG_CSV))
}

/// The version of the catalog bcd follows (`xid-catalog-ampere+/1-162/…`).
pub fn version() -> &'static str {
    catalog().version
}

/// Parses the catalog file: `#` comments, `version,<v>`, the header, then `xid,mnemonic,
/// catalogAction,bucket,description` lines. A line that does not parse is kept in
/// [`Catalog::rejected`], never a panic.
pub fn parse(text: &'static str) -> Catalog {
    let mut out = Catalog {
        version: "",
        entries: Vec::new(),
        rejected: Vec::new(),
    };
    for (n, line) in text.lines().enumerate() {
        let line = line.trim_end();
        if line.is_empty() || line.starts_with('#') || line.starts_with("xid,") {
            continue;
        }
        if let Some(v) = line.strip_prefix("version,") {
            out.version = v;
            continue;
        }
        let f: Vec<&'static str> = line.splitn(5, ',').collect();
        let entry = match f.as_slice() {
            [x, mnemonic, action, bucket, description] => x
                .parse()
                .ok()
                .zip(Bucket::parse(bucket))
                .map(|(xid, bucket)| Entry {
                    xid,
                    mnemonic: mnemonic.trim(),
                    catalog_action: action.trim(),
                    bucket,
                    description: description.trim(),
                }),
            _ => None,
        };
        match entry {
            Some(e) => out.entries.push(e),
            None => out.rejected.push((n + 1, line)),
        }
    }
    out.entries.sort_by_key(|e| e.xid);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_catalog_parses_whole_and_in_order() {
        let c = catalog();
        assert!(c.rejected.is_empty(), "{:?}", c.rejected);
        assert_eq!(c.version, "xid-catalog-ampere+/1-162/nvsentinel-6f8b0fcf");
        assert_eq!(c.entries.len(), 162);
        let xids: Vec<u64> = c.entries.iter().map(|e| e.xid).collect();
        assert_eq!(xids, (1..=162).collect::<Vec<u64>>(), "every Xid once");
        let e = c.get(48).copied();
        assert_eq!(
            e.map(|e| (e.mnemonic, e.catalog_action, e.bucket)),
            Some((
                "ROBUST_CHANNEL_GPU_ECC_DBE",
                "WORKFLOW_XID_48",
                Bucket::ResetGpu
            ))
        );
        assert_eq!(c.get(79).map(|e| e.bucket), Some(Bucket::RebootNode));
        assert_eq!(c.get(154).map(|e| e.bucket), Some(Bucket::Announced));
        assert_eq!(c.get(162).and_then(Entry::words), None);
        assert_eq!(
            c.get(70).and_then(Entry::words),
            Some("ROBUST_CHANNEL_CE3_ERROR")
        );
        assert!(c.get(163).is_none() && c.get(0).is_none());
    }

    #[test]
    fn a_bad_line_is_rejected_not_fatal() {
        let c =
            parse("version,v1\nxid,m,a,b,d\n7,X,IGNORE,ignore,\nnot,a,line\n8,Y,Z,sometimes,\n");
        assert_eq!(c.version, "v1");
        assert_eq!(c.entries.len(), 1);
        assert_eq!(c.rejected.iter().map(|r| r.0).collect::<Vec<_>>(), [4, 5]);
    }
}
