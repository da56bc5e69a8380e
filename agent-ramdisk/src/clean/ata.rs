//! ATA security erase of a SATA disk (`bcd_probes::erase::ata_security`), for the full erase:
//! the sequence hdparm's `--security-erase` and ironic's ATA erase send, only from a state in
//! which it can end well.
//!
//! Attempted only when IDENTIFY DEVICE says the Security feature set is supported, no password
//! is set, the drive is neither locked nor frozen (most firmware freezes SATA drives at boot,
//! so on many servers this is skipped with a step saying `frozen`) and the password attempt
//! counter has not expired. Then: SET PASSWORD (the user password `bcd-erase`), ERASE PREPARE,
//! ERASE UNIT (enhanced when supported), IDENTIFY again. A drive that refuses the password is
//! left as it was and the next erase method is tried; once the password is set, any failure
//! sends DISABLE PASSWORD (so the drive is not left locked at its next power-on) and fails the
//! disk, and a password still set after a successful erase is removed the same way.

use bcd_probes::erase::ata_security::{SecurityCommand, SecurityState};

use super::DiskError;

/// The drive, as the sequence needs it: a real disk through `SG_IO`, or a fake in tests.
pub trait AtaDrive {
    /// IDENTIFY DEVICE's security state.
    fn identify(&mut self) -> Result<SecurityState, String>;
    /// Sends one security command; blocks until the drive answers.
    fn send(&mut self, command: SecurityCommand) -> Result<(), String>;
}

/// The real drive behind an open block device.
#[derive(Debug)]
pub struct SgDrive<'a> {
    /// The disk's block device, open.
    pub file: &'a std::fs::File,
    /// Its path, for errors.
    pub shown: String,
}

impl AtaDrive for SgDrive<'_> {
    fn identify(&mut self) -> Result<SecurityState, String> {
        bcd_probes::erase::ata_security::identify(self.file, &self.shown).map_err(|e| e.to_string())
    }

    fn send(&mut self, command: SecurityCommand) -> Result<(), String> {
        bcd_probes::erase::ata_security::send(self.file, &self.shown, command)
            .map_err(|e| e.to_string())
    }
}

/// The security erase of the module docs: `Ok(true)` when the drive erased itself, `Ok(false)`
/// when it could not start (the next method comes), `Err` when it failed once started.
pub fn secure_erase(drive: &mut dyn AtaDrive, steps: &mut Vec<String>) -> Result<bool, DiskError> {
    let skip = |steps: &mut Vec<String>, why: &str| {
        steps.push(format!("ataSecureErase: {why}"));
        Ok(false)
    };
    let s = match drive.identify() {
        Ok(s) => s,
        Err(e) => return skip(steps, &format!("IDENTIFY DEVICE: {e}")),
    };
    let refusal = if !s.supported {
        Some("not supported")
    } else if s.frozen {
        Some("frozen (the firmware froze the security state at boot)")
    } else if s.locked {
        Some("locked by a password already set")
    } else if s.enabled {
        Some("a password is already set")
    } else if s.count_expired {
        Some("password attempts expired")
    } else {
        None
    };
    if let Some(why) = refusal {
        return skip(steps, why);
    }
    if let Err(e) = drive.send(SecurityCommand::SetPassword) {
        return skip(steps, &format!("SET PASSWORD: {e}"));
    }
    let enhanced = s.enhanced;
    let erase = SecurityCommand::EraseUnit {
        enhanced,
        timeout_ms: s.erase_timeout_ms(enhanced),
    };
    let erased = drive
        .send(SecurityCommand::ErasePrepare)
        .map_err(|e| format!("ERASE PREPARE: {e}"))
        .and_then(|()| drive.send(erase).map_err(|e| format!("ERASE UNIT: {e}")));
    if let Err(what) = erased {
        let unset = match drive.send(SecurityCommand::DisablePassword) {
            Ok(()) => "password removed".to_owned(),
            Err(e) => format!("password bcd-erase still set: DISABLE PASSWORD: {e}"),
        };
        steps.push(format!("ataSecureErase: {what} ({unset})"));
        return Err(DiskError::Ata(format!("{what} ({unset})")));
    }
    let kind = if enhanced { "enhanced" } else { "normal" };
    // ERASE UNIT clears the user password; a drive that kept it must not stay locked.
    let kept = drive.identify().map(|s| s.enabled).unwrap_or(true);
    if kept && let Err(e) = drive.send(SecurityCommand::DisablePassword) {
        steps.push(format!(
            "ataSecureErase {kind}: erased, but the password stays"
        ));
        return Err(DiskError::Ata(format!(
            "erased, but password bcd-erase still set: DISABLE PASSWORD: {e}"
        )));
    }
    steps.push(format!("ataSecureErase {kind}"));
    Ok(true)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A drive that records what it was sent and fails the commands named.
    struct Fake {
        state: SecurityState,
        fail: Vec<u8>,
        sent: Vec<u8>,
        keeps_password: bool,
    }

    impl Fake {
        fn new() -> Self {
            Self {
                state: SecurityState {
                    supported: true,
                    enabled: false,
                    locked: false,
                    frozen: false,
                    count_expired: false,
                    enhanced: true,
                    erase_minutes: Some(2),
                    enhanced_erase_minutes: Some(4),
                },
                fail: vec![],
                sent: vec![],
                keeps_password: false,
            }
        }
    }

    impl AtaDrive for Fake {
        fn identify(&mut self) -> Result<SecurityState, String> {
            Ok(self.state)
        }
        fn send(&mut self, c: SecurityCommand) -> Result<(), String> {
            self.sent.push(c.code());
            if self.fail.contains(&c.code()) {
                return Err("aborted".into());
            }
            match c {
                SecurityCommand::SetPassword => self.state.enabled = true,
                SecurityCommand::EraseUnit {
                    enhanced,
                    timeout_ms,
                } => {
                    assert!(enhanced);
                    assert_eq!(timeout_ms, 18 * 60_000);
                    self.state.enabled = self.keeps_password;
                }
                SecurityCommand::DisablePassword => self.state.enabled = false,
                SecurityCommand::ErasePrepare => {}
            }
            Ok(())
        }
    }

    #[test]
    fn the_sequence_and_a_drive_that_cannot_start_it() {
        let mut d = Fake::new();
        let mut steps = vec![];
        assert!(secure_erase(&mut d, &mut steps).unwrap());
        assert_eq!(d.sent, [0xf1, 0xf3, 0xf4]);
        assert_eq!(steps, ["ataSecureErase enhanced"]);
        assert!(!d.state.enabled);

        let mut d = Fake::new();
        d.state.frozen = true;
        let mut steps = vec![];
        assert!(!secure_erase(&mut d, &mut steps).unwrap());
        assert!(d.sent.is_empty(), "nothing sent to a frozen drive");
        assert!(steps[0].starts_with("ataSecureErase: frozen"), "{steps:?}");

        let mut d = Fake::new();
        d.state.enabled = true;
        assert!(!secure_erase(&mut d, &mut vec![]).unwrap());
        assert!(
            d.sent.is_empty(),
            "a password someone else set is not touched"
        );

        let mut d = Fake::new();
        d.fail = vec![0xf1];
        let mut steps = vec![];
        assert!(!secure_erase(&mut d, &mut steps).unwrap());
        assert_eq!(d.sent, [0xf1]);
        assert_eq!(steps, ["ataSecureErase: SET PASSWORD: aborted"]);
    }

    #[test]
    fn a_failed_erase_removes_the_password_and_fails_the_disk() {
        let mut d = Fake::new();
        d.fail = vec![0xf4];
        let mut steps = vec![];
        let e = secure_erase(&mut d, &mut steps).unwrap_err();
        assert_eq!(d.sent, [0xf1, 0xf3, 0xf4, 0xf6]);
        assert!(!d.state.enabled);
        assert_eq!(
            e.to_string(),
            "ATA security erase: ERASE UNIT: aborted (password removed)"
        );

        let mut d = Fake::new();
        d.fail = vec![0xf3, 0xf6];
        let e = secure_erase(&mut d, &mut vec![]).unwrap_err();
        assert!(
            e.to_string().contains("password bcd-erase still set"),
            "{e}"
        );

        // A drive that keeps the password after erasing has it removed.
        let mut d = Fake::new();
        d.keeps_password = true;
        assert!(secure_erase(&mut d, &mut vec![]).unwrap());
        assert_eq!(d.sent, [0xf1, 0xf3, 0xf4, 0xf6]);
        assert!(!d.state.enabled);
    }
}
