//! NVMe Format NVM for the full erase (`bcd_probes::erase::nvme_format`): the namespace's
//! current LBA format kept, Secure Erase Settings 2 (crypto) tried only when Identify
//! Controller FNA bit 2 says it exists, then 1 (user data), then 0 — the `-s2 → -s1 → -s0` of
//! NVIDIA's scout cleanup, because not every drive supports each. A setting the drive refuses
//! (Invalid Field, Invalid Opcode, Invalid Format) is a step and the next is tried; any other
//! error fails the disk. A controller without Format NVM (OACS bit 1), or one that refuses all
//! three, leaves the disk to the block path (discard, zeroing).

use bcd_probes::erase::nvme_format::{
    self, FormatCaps, NamespaceFormat, NvmeCommandError, SecureErase,
};

use super::DiskError;

/// The namespace, as the sequence needs it: a real one through the passthrough ioctl, or a
/// fake in tests.
pub trait Namespace {
    /// Its namespace id.
    fn nsid(&mut self) -> Result<u32, NvmeCommandError>;
    /// Identify Controller's Format NVM capabilities.
    fn caps(&mut self) -> Result<FormatCaps, NvmeCommandError>;
    /// Identify Namespace's current format.
    fn format_in_use(&mut self, nsid: u32) -> Result<NamespaceFormat, NvmeCommandError>;
    /// Format NVM keeping `format`, with `ses`; blocks until done.
    fn format_nvm(
        &mut self,
        nsid: u32,
        format: &NamespaceFormat,
        ses: SecureErase,
    ) -> Result<(), NvmeCommandError>;
}

/// A namespace's block device, open.
#[derive(Debug)]
pub struct IoctlNamespace<'a> {
    /// `/dev/nvme<S>n<N>`.
    pub file: &'a std::fs::File,
}

impl Namespace for IoctlNamespace<'_> {
    fn nsid(&mut self) -> Result<u32, NvmeCommandError> {
        nvme_format::namespace_id(self.file)
    }
    fn caps(&mut self) -> Result<FormatCaps, NvmeCommandError> {
        nvme_format::format_caps(self.file)
    }
    fn format_in_use(&mut self, nsid: u32) -> Result<NamespaceFormat, NvmeCommandError> {
        nvme_format::namespace_format(self.file, nsid)
    }
    fn format_nvm(
        &mut self,
        nsid: u32,
        format: &NamespaceFormat,
        ses: SecureErase,
    ) -> Result<(), NvmeCommandError> {
        nvme_format::format_nvm(self.file, nsid, format, ses)
    }
}

/// The fallback of the module docs: `Ok(true)` when a format completed, `Ok(false)` when the
/// block path must erase the disk instead.
pub fn format(ns: &mut dyn Namespace, steps: &mut Vec<String>) -> Result<bool, DiskError> {
    let skip = |steps: &mut Vec<String>, why: String| {
        steps.push(format!("nvmeFormat: {why}"));
        Ok(false)
    };
    let nsid = match ns.nsid() {
        Ok(n) => n,
        Err(e) => return skip(steps, format!("namespace id: {e}")),
    };
    let caps = match ns.caps() {
        Ok(c) => c,
        Err(e) => return skip(steps, format!("Identify Controller: {e}")),
    };
    if !caps.format {
        return skip(
            steps,
            "not supported (Identify Controller OACS bit 1 clear)".into(),
        );
    }
    let format = ns.format_in_use(nsid).map_err(|e| DiskError::Nvme {
        what: "Identify Namespace".into(),
        source: e,
    })?;
    for (ses, n) in [
        (SecureErase::Crypto, 2),
        (SecureErase::UserData, 1),
        (SecureErase::None, 0),
    ] {
        if ses == SecureErase::Crypto && !caps.crypto_erase {
            steps.push("nvmeFormat ses=2: not supported (FNA bit 2 clear)".into());
            continue;
        }
        match ns.format_nvm(nsid, &format, ses) {
            Ok(()) => {
                steps.push(format!("nvmeFormat ses={n}"));
                return Ok(true);
            }
            Err(e @ NvmeCommandError::Status(s)) if e.is_unsupported() => {
                steps.push(format!("nvmeFormat ses={n}: not supported (status {s:#x})"));
            }
            Err(e) => {
                return Err(DiskError::Nvme {
                    what: format!("Format NVM ses={n}"),
                    source: e,
                });
            }
        }
    }
    Ok(false)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A namespace that answers each Format NVM from a script, and records what it was sent.
    struct Fake {
        caps: FormatCaps,
        answers: Vec<Result<(), NvmeCommandError>>,
        sent: Vec<(u32, u32)>,
    }

    impl Fake {
        fn new(crypto_erase: bool, answers: Vec<Result<(), NvmeCommandError>>) -> Self {
            Self {
                caps: FormatCaps {
                    format: true,
                    crypto_erase,
                    erase_all_namespaces: false,
                },
                answers,
                sent: vec![],
            }
        }
    }

    impl Namespace for Fake {
        fn nsid(&mut self) -> Result<u32, NvmeCommandError> {
            Ok(3)
        }
        fn caps(&mut self) -> Result<FormatCaps, NvmeCommandError> {
            Ok(self.caps)
        }
        fn format_in_use(&mut self, nsid: u32) -> Result<NamespaceFormat, NvmeCommandError> {
            assert_eq!(nsid, 3);
            Ok(NamespaceFormat {
                blocks: 1 << 20,
                lbaf: 1,
                extended_metadata: false,
                pi_type: 0,
                pi_first: false,
            })
        }
        fn format_nvm(
            &mut self,
            nsid: u32,
            f: &NamespaceFormat,
            ses: SecureErase,
        ) -> Result<(), NvmeCommandError> {
            self.sent.push((nsid, f.format_cdw10(ses)));
            self.answers.remove(0)
        }
    }

    const INVALID_FIELD: NvmeCommandError = NvmeCommandError::Status(0x4002);

    #[test]
    fn crypto_then_user_data_then_none_each_refusal_a_step() {
        let mut ns = Fake::new(true, vec![Err(INVALID_FIELD), Ok(())]);
        let mut steps = vec![];
        assert!(format(&mut ns, &mut steps).unwrap());
        // LBA format 1 kept; SES 2 then 1 in bits 11:9.
        assert_eq!(ns.sent, [(3, 0x401), (3, 0x201)]);
        assert_eq!(
            steps,
            [
                "nvmeFormat ses=2: not supported (status 0x4002)",
                "nvmeFormat ses=1"
            ]
        );

        let mut ns = Fake::new(false, vec![Err(INVALID_FIELD), Ok(())]);
        let mut steps = vec![];
        assert!(format(&mut ns, &mut steps).unwrap());
        assert_eq!(ns.sent, [(3, 0x201), (3, 0x001)], "no crypto erase tried");
        assert_eq!(
            steps,
            [
                "nvmeFormat ses=2: not supported (FNA bit 2 clear)",
                "nvmeFormat ses=1: not supported (status 0x4002)",
                "nvmeFormat ses=0"
            ]
        );
    }

    #[test]
    fn a_drive_that_refuses_all_goes_to_the_block_path_and_a_failure_fails() {
        let refuse = NvmeCommandError::Status(0x10a);
        let mut ns = Fake::new(true, vec![Err(refuse), Err(refuse), Err(refuse)]);
        let mut steps = vec![];
        assert!(!format(&mut ns, &mut steps).unwrap());
        assert_eq!(steps.len(), 3);

        let mut ns = Fake::new(true, vec![Err(NvmeCommandError::Status(0x6))]);
        let e = format(&mut ns, &mut vec![]).unwrap_err();
        assert_eq!(e.to_string(), "NVMe Format NVM ses=2: NVMe status 0x6");

        let mut ns = Fake::new(true, vec![]);
        ns.caps.format = false;
        let mut steps = vec![];
        assert!(!format(&mut ns, &mut steps).unwrap());
        assert!(ns.sent.is_empty());
        assert_eq!(
            steps,
            ["nvmeFormat: not supported (Identify Controller OACS bit 1 clear)"]
        );
    }
}
