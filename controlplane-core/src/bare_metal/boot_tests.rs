//! The ramdisk's join with its boot token and the inspection it ends (issue 15), through the
//! core with a real store: a match re-joins in place and an inventory takes the node to
//! `ready`; a replayed, expired, misused or mismatched token is refused; a mismatch is recorded
//! (`HardwareMismatch`) and fails the node only the third time, or by the deadline (issue 30.2).

use std::time::Duration;

use bc_protocol::commands::bmc::{BmcFacts, BmcNic, PowerState};
use bc_protocol::hwid::{self, Kind};
use bc_protocol::{
    Adapter, ConditionStatus, Mode, NodeRole, PoolAgent, PoolKind, ProvisionState, Trust,
};
use cpl_store::{BmcRecord, NewNode, NodeRecord, Store, Tx, now_ms};

use super::CredentialKey;
use super::boot::{self, BootRefusal, BootSettings, HARDWARE_MISMATCH};
use super::commission::COMMISSIONED;
use super::verify::identifiers;
use crate::error::OpError;
use crate::join::{JoinError, JoinFacts, JoinOutcome, join};
use crate::ops::pools::{self, NewPool};
use crate::reports::{InventoryReport, record_inventory};

pub(super) type TestResult = Result<(), Box<dyn std::error::Error>>;

pub(super) const UUID: &str = "5f2e0c4e-1c9a-4a51-9a43-0123456789ab";
pub(super) const SERIAL: &str = "SER-RD-0001";
pub(super) const MAC: &str = "00:1b:21:aa:bb:01";

/// The machine's identifier digests as its hardware key computes them.
pub(super) fn digests(uuid: &str, serial: &str, mac: &str) -> Vec<String> {
    let mut d = vec![
        hwid::digest(&hwid::uuid_line(uuid).unwrap_or_default()),
        hwid::digest(&hwid::serial_line(Kind::SystemSerial, serial).unwrap_or_default()),
        hwid::digest(&hwid::mac_line(mac).unwrap_or_default()),
    ];
    d.sort();
    d
}

pub(super) struct Bed {
    pub(super) store: Store,
    pub(super) key: CredentialKey,
    pub(super) node: String,
}

/// A node `inspecting` with a verified BMC that reported UUID, SERIAL and MAC, in a pool with
/// `profile_gpus` expected GPUs.
pub(super) fn bed(profile_gpus: Option<u32>) -> Result<Bed, Box<dyn std::error::Error>> {
    let store = cpl_store::testing::store()?;
    let key = CredentialKey::generate();
    let node = "node_rd".to_owned();
    store.write_blocking(|tx| {
        let pool = pools::create(
            tx,
            &NewPool {
                name: "metal".into(),
                kind: PoolKind::MetalHost,
                agent: PoolAgent::Bcd,
                site_id: None,
                owner_tenant_id: None,
                hardware_profile: cpl_store::HardwareProfile {
                    expected_gpu_count: profile_gpus,
                    ..Default::default()
                },
                acceptance: Default::default(),
            },
        )?;
        tx.insert_node_in(
            &NewNode {
                id: node.clone(),
                site_id: None,
                pool_id: Some(pool.id),
                owner_tenant_id: None,
                role: NodeRole::Host,
                trust: Trust::Platform,
                adapter: Adapter::BcdV1,
                drivers: Default::default(),
                hostname: Some("m1".into()),
                hardware_key: None,
                hardware_key_trusted: false,
                identifier_digests: vec![],
            },
            ProvisionState::Inspecting,
            1,
        )?;
        let facts = BmcFacts {
            system_path: "/redfish/v1/Systems/1".into(),
            uuid: Some(UUID.into()),
            serial: Some(SERIAL.into()),
            manufacturer: None,
            model: None,
            nics: vec![BmcNic {
                id: "1".into(),
                mac: MAC.into(),
            }],
            power: PowerState::Off,
            cert_sha256: None,
            note: None,
        };
        tx.put_bmc(&BmcRecord {
            node_id: node.clone(),
            address: "redfish+http://127.0.0.1:1".into(),
            tls: "pin".into(),
            credentials: "sealed".into(),
            candidate: None,
            cert_sha256: None,
            facts: Some(serde_json::json!({"uuid": UUID, "serial": SERIAL, "macs": [MAC]})),
            identifiers: identifiers(&facts),
            macs: vec![],
            verified_at: Some(1),
            verify_command_id: None,
            verify_started_at: None,
            last_error: None,
            power_expected: None,
            power_expected_at: None,
            reachable: Some(true),
            created_at: 1,
            inspect: true,
            deployed: false,
            deployment: None,
            rescue: None,
        })?;
        Ok::<_, OpError>(())
    })?;
    Ok(Bed { store, key, node })
}

impl Bed {
    /// Begins a boot valid for `ttl` and returns its token in clear.
    pub(super) fn boot(&self, ttl: Duration) -> Result<String, Box<dyn std::error::Error>> {
        let b = self.store.write_blocking(|tx| {
            boot::begin(
                tx,
                &self.key,
                &self.node,
                ProvisionState::Inspecting,
                ttl,
                now_ms(),
            )
        })?;
        let args = boot::kernel_args(
            &self.key,
            &BootSettings {
                gateway_url: "https://10.0.2.2:7443".into(),
                ca_pin: "sha256:00".into(),
            },
            &b,
        )?;
        assert!(
            args.starts_with("bcd.url=https://10.0.2.2:7443 bcd.pin=sha256:00 "),
            "{args}"
        );
        let token = args
            .split_whitespace()
            .find_map(|a| a.strip_prefix("bcd.token="))
            .ok_or("no bcd.token")?;
        assert!(token.starts_with("boot_"), "{token}");
        Ok(token.to_owned())
    }

    pub(super) fn join(
        &self,
        token: &str,
        mode: Mode,
        d: Vec<String>,
    ) -> Result<JoinOutcome, JoinError> {
        let f = JoinFacts {
            token: token.to_owned(),
            hardware_key: "ab".repeat(32),
            trusted: true,
            identifier_digests: d,
            hostname: Some("ramdisk".into()),
            peer: Some("127.0.0.1".into()),
            mode,
        };
        self.store.write_blocking(|tx| join(tx, &f, &|_| false))
    }

    /// The ramdisk's inventory report `document` with the machine's own identifiers (UUID,
    /// SERIAL, MAC) and a trusted key; the provision state after it.
    pub(super) fn report(&self, document: &[u8]) -> Result<Option<ProvisionState>, OpError> {
        let d = digests(UUID, SERIAL, MAC);
        self.store.write_blocking(|tx: &Tx<'_>| {
            record_inventory(
                tx,
                &self.node,
                0,
                &InventoryReport {
                    hardware_key: &"ab".repeat(32),
                    trusted: true,
                    digests: &d,
                    document,
                    sha256: &"cd".repeat(32),
                },
            )
        })
    }

    pub(super) fn node(&self) -> Result<NodeRecord, Box<dyn std::error::Error>> {
        Ok(self
            .store
            .read_blocking(|r| r.node(&self.node))?
            .ok_or("node vanished")?)
    }
}

pub(super) fn cond<'a>(n: &'a NodeRecord, t: &str) -> Option<&'a bc_protocol::Condition> {
    n.conditions.iter().find(|c| c.type_ == t)
}

#[test]
fn the_right_machine_joins_once_and_its_inventory_makes_it_ready() -> TestResult {
    let b = bed(None)?;
    let token = b.boot(Duration::from_secs(600))?;
    let before = b.node()?.identity_generation;
    let joined = match b.join(&token, Mode::Ramdisk, digests(UUID, SERIAL, MAC))? {
        JoinOutcome::Joined(j) => j,
        other => return Err(format!("expected a join, got {other:?}").into()),
    };
    assert_eq!(joined.node_id, b.node);
    assert!(joined.rejoined);
    assert_eq!(
        joined.identity_generation,
        before + 1,
        "a ramdisk boot is a new identity"
    );
    let n = b.node()?;
    assert_eq!(n.provision_state, ProvisionState::Inspecting);
    assert_eq!(
        cond(&n, HARDWARE_MISMATCH).map(|c| c.status),
        Some(ConditionStatus::False)
    );
    // The same token again: a replay.
    match b.join(&token, Mode::Ramdisk, digests(UUID, SERIAL, MAC)) {
        Err(JoinError::Boot(BootRefusal::Used { .. })) => {}
        other => return Err(format!("a replay must be refused as Used, got {other:?}").into()),
    }
    // The ramdisk's inventory: inspection ends, commissioning passes, the node is ready.
    let doc = br#"{"hostname":"ramdisk"}"#;
    let state = b.report(doc)?;
    assert_eq!(state, Some(ProvisionState::Ready));
    let n = b.node()?;
    assert_eq!(
        cond(&n, COMMISSIONED).map(|c| c.status),
        Some(ConditionStatus::True)
    );
    let moves: Vec<(Option<String>, Option<String>)> = b
        .store
        .read_blocking(|r| r.events(&b.node))?
        .into_iter()
        .filter(|e| e.kind == "provisionState")
        .map(|e| (e.from, e.to))
        .collect();
    assert!(
        moves.ends_with(&[
            (Some("inspecting".into()), Some("commissioning".into())),
            (Some("commissioning".into()), Some("ready".into())),
        ]),
        "{moves:?}"
    );
    Ok(())
}

#[test]
fn another_machine_is_evidence_not_a_verdict_the_real_one_still_joins() -> TestResult {
    let b = bed(None)?;
    let token = b.boot(Duration::from_secs(600))?;
    let out = b.join(&token, Mode::Ramdisk, digests(UUID, "SER-OTHER-9", MAC))?;
    let JoinOutcome::Refused(r) = out else {
        return Err(format!("expected a refusal, got {out:?}").into());
    };
    assert!(r.message.starts_with("HARDWARE_MISMATCH"), "{}", r.message);
    // The asker learns nothing of the real machine; operators read it in the condition.
    assert!(
        !r.message.contains(SERIAL) && !r.message.contains(UUID),
        "{}",
        r.message
    );
    let n = b.node()?;
    assert_eq!(
        n.provision_state,
        ProvisionState::Inspecting,
        "one mismatch fails nothing"
    );
    assert!(!n.maintenance);
    let c = cond(&n, HARDWARE_MISMATCH).ok_or("no HardwareMismatch")?;
    assert_eq!(c.status, ConditionStatus::True);
    assert!(
        c.message.contains("system serial")
            && c.message.contains(SERIAL)
            && c.message.contains("mismatched join 1 of this boot")
            && c.message.contains("127.0.0.1"),
        "{}",
        c.message
    );
    assert!(
        !c.message.contains("system UUID"),
        "only the serial differed: {}",
        c.message
    );
    let rec = b
        .store
        .read_blocking(|r| r.boot(&b.node))?
        .ok_or("no boot")?;
    assert_eq!((rec.mismatches, rec.used_at), (1, None));
    // The token is still good for the machine the BMC described.
    assert!(matches!(
        b.join(&token, Mode::Ramdisk, digests(UUID, SERIAL, MAC))?,
        JoinOutcome::Joined(_)
    ));
    let n = b.node()?;
    let c = cond(&n, HARDWARE_MISMATCH).ok_or("no HardwareMismatch")?;
    assert_eq!(c.status, ConditionStatus::False);
    Ok(())
}

#[test]
fn no_number_of_mismatches_fails_the_node_or_spends_the_token() -> TestResult {
    // Whoever fetched the script by a MAC may join with it as often as the boot service lets
    // it; no MAC of the BMC's on the machine is a mismatch too.
    let b = bed(None)?;
    let token = b.boot(Duration::from_secs(600))?;
    let other = || digests(UUID, SERIAL, "00:1b:21:aa:bb:99");
    for n in 1..=10 {
        let JoinOutcome::Refused(r) = b.join(&token, Mode::Ramdisk, other())? else {
            return Err(format!("mismatched join {n} joined").into());
        };
        assert!(!r.message.contains("failed"), "{}", r.message);
        let node = b.node()?;
        assert_eq!(node.provision_state, ProvisionState::Inspecting, "{n}");
        assert!(!node.maintenance, "{n}");
    }
    let c = cond(&b.node()?, HARDWARE_MISMATCH)
        .map(|c| c.message.clone())
        .unwrap_or_default();
    assert!(
        c.contains("MAC: none of 00:1b:21:aa:bb:01")
            && c.contains("mismatched join 10 of this boot"),
        "{c}"
    );
    let rec = b
        .store
        .read_blocking(|r| r.boot(&b.node))?
        .ok_or("no boot")?;
    assert_eq!((rec.mismatches, rec.used_at), (10, None));
    // The machine the BMC described still joins with the token.
    assert!(matches!(
        b.join(&token, Mode::Ramdisk, digests(UUID, SERIAL, MAC))?,
        JoinOutcome::Joined(_)
    ));
    Ok(())
}

#[test]
fn the_deadline_fails_a_boot_that_saw_only_mismatches_saying_so() -> TestResult {
    let b = bed(None)?;
    let token = b.boot(Duration::from_secs(600))?;
    b.join(&token, Mode::Ramdisk, digests(UUID, "SER-OTHER-9", MAC))?;
    let failed = b.store.write_blocking(|tx| {
        let mut rec = tx
            .boot(&b.node)?
            .ok_or(OpError::Internal("no boot".into()))?;
        rec.phase_started_at -= 10 * 3_600_000;
        tx.put_boot(&rec)?;
        super::table::fail_overdue(tx, &rec, cpl_store::now_ms())
    })?;
    assert!(failed);
    let n = b.node()?;
    assert_eq!(n.provision_state, ProvisionState::Failed);
    let c = cond(&n, "Inspected").ok_or("no Inspected")?;
    assert_eq!(c.reason, "InspectionDeadline");
    assert!(
        c.message.contains("1 join(s) with its boot token"),
        "{}",
        c.message
    );
    Ok(())
}

#[test]
fn expired_unknown_malformed_and_misused_tokens_are_refused_without_a_change() -> TestResult {
    let b = bed(None)?;
    let token = b.boot(Duration::from_millis(0))?;
    std::thread::sleep(Duration::from_millis(5));
    let d = || digests(UUID, SERIAL, MAC);
    assert!(matches!(
        b.join(&token, Mode::Ramdisk, d()),
        Err(JoinError::Boot(BootRefusal::Expired { .. }))
    ));
    let fresh = b.boot(Duration::from_secs(600))?;
    // The older boot's token is unknown once a new boot replaced it.
    assert!(matches!(
        b.join(&token, Mode::Ramdisk, d()),
        Err(JoinError::Boot(BootRefusal::Unknown { .. }))
    ));
    let (id, _) = fresh.split_once('.').ok_or("no dot")?;
    assert!(matches!(
        b.join(&format!("{id}.wrongsecret"), Mode::Ramdisk, d()),
        Err(JoinError::Boot(BootRefusal::Unknown { .. }))
    ));
    assert!(matches!(
        b.join("boot_", Mode::Ramdisk, d()),
        Err(JoinError::Boot(BootRefusal::Malformed))
    ));
    // A node agent may not use a boot token, nor the ramdisk a join token.
    assert!(matches!(
        b.join(&fresh, Mode::Node, d()),
        Err(JoinError::Boot(BootRefusal::WrongMode(_)))
    ));
    assert!(matches!(
        b.join("tok_abc.secret", Mode::Ramdisk, d()),
        Err(JoinError::Boot(BootRefusal::WrongMode(_)))
    ));
    // None of it changed the node, and the fresh token still works.
    assert_eq!(b.node()?.provision_state, ProvisionState::Inspecting);
    assert!(matches!(
        b.join(&fresh, Mode::Ramdisk, d())?,
        JoinOutcome::Joined(_)
    ));
    Ok(())
}

#[test]
fn commissioning_fails_on_the_profile_naming_the_step() -> TestResult {
    let b = bed(Some(8))?;
    let token = b.boot(Duration::from_secs(600))?;
    let d = digests(UUID, SERIAL, MAC);
    assert!(matches!(
        b.join(&token, Mode::Ramdisk, d.clone())?,
        JoinOutcome::Joined(_)
    ));
    let state = b.report(br#"{"hostname":"ramdisk","gpus":[]}"#)?;
    assert_eq!(state, Some(ProvisionState::Failed));
    let n = b.node()?;
    assert_eq!(n.failed_from, Some(ProvisionState::Commissioning));
    let c = cond(&n, COMMISSIONED).ok_or("no Commissioned")?;
    assert_eq!(c.status, ConditionStatus::False);
    assert!(c.message.contains("gpuCount"), "{}", c.message);
    Ok(())
}

#[test]
fn the_deadline_defaults_and_pool_settings_apply() {
    use super::commission::DEFAULT_COMMISSIONING_DEADLINE;
    use super::inspect::DEFAULT_INSPECTION_DEADLINE;
    use super::table::deadline;
    assert_eq!(
        deadline(None, ProvisionState::Inspecting),
        Some(DEFAULT_INSPECTION_DEADLINE)
    );
    assert_eq!(
        deadline(None, ProvisionState::Commissioning),
        Some(DEFAULT_COMMISSIONING_DEADLINE)
    );
}
