//! Bare metal through the core with a scripted set of live sessions: enrollment and its
//! verification, failure and recovery, the lease moving (and `LEASE_LOST`), power reports, the
//! rotation of credentials, and the verification deadline.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bc_protocol::commands::bmc::{BmcFacts, BmcNic, PowerState};
use bc_protocol::pb::{
    CommandUpdate, ErrorInfo, GatewayMessage, GoodbyeReason, PowerObservation, PowerReport,
    SiteAssignment, gateway_message::Msg,
};
use bc_protocol::{ConditionStatus, Connectivity, NodeRole, Power, ProvisionState, SiteKind};
use cpl_store::{CommandState, NewNode, NodeRecord, Store, now_ms};
use parking_lot::Mutex;

use super::enroll::{BmcInput, EnrollRequest, Secret, TlsMode};
use super::power::{PowerRequest, ReportOutcome, UpdateBmcCredentialsRequest};
use super::{BareMetal, BareMetalConfig, CredentialKey};
use crate::commands::Commands;
use crate::error::OpError;
use crate::port::{AgentSessions, PortFuture};

pub(super) type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Live sessions by node id, and every message sent.
#[derive(Debug, Default)]
pub(super) struct Sessions {
    live: Mutex<HashMap<String, u64>>,
    sent: Mutex<Vec<(String, GatewayMessage)>>,
}

impl Sessions {
    fn connect(&self, id: &str) {
        self.live.lock().insert(id.to_owned(), 1);
    }
    fn drop_session(&self, id: &str) {
        self.live.lock().remove(id);
    }
    fn assignments(&self, id: &str) -> Vec<SiteAssignment> {
        self.sent
            .lock()
            .iter()
            .filter(|(n, _)| n == id)
            .filter_map(|(_, m)| match &m.msg {
                Some(Msg::SiteAssignment(a)) => Some(a.clone()),
                _ => None,
            })
            .collect()
    }
    pub(super) fn commands(&self, id: &str) -> Vec<bc_protocol::pb::Command> {
        self.sent
            .lock()
            .iter()
            .filter(|(n, _)| n == id)
            .filter_map(|(_, m)| match &m.msg {
                Some(Msg::Command(c)) => Some(c.clone()),
                _ => None,
            })
            .collect()
    }
}

impl AgentSessions for Sessions {
    fn live_epoch(&self, node_id: &str) -> Option<u64> {
        self.live.lock().get(node_id).copied()
    }
    fn send<'a>(&'a self, node_id: &'a str, msg: GatewayMessage) -> PortFuture<'a, bool> {
        let live = self.live_epoch(node_id).is_some();
        if live {
            self.sent.lock().push((node_id.to_owned(), msg));
        }
        Box::pin(async move { live })
    }
    fn close(&self, _: &str, _: GoodbyeReason, _: &str) -> Option<u64> {
        None
    }
}

pub(super) const SITE: &str = "site_t";

pub(super) struct World {
    pub(super) store: Store,
    pub(super) sessions: Arc<Sessions>,
    pub(super) bm: BareMetal,
}

pub(super) fn world() -> Result<World, Box<dyn std::error::Error>> {
    let store = cpl_store::testing::store()?;
    let sessions = Arc::new(Sessions::default());
    let commands = Commands {
        store: store.clone(),
        sessions: Arc::clone(&sessions) as Arc<dyn AgentSessions>,
    };
    let cfg = BareMetalConfig {
        lease_ttl: Duration::from_secs(15),
        verify_deadline: Duration::from_secs(60),
        ..BareMetalConfig::default()
    };
    let bm = BareMetal::new(commands, CredentialKey::generate(), cfg);
    store.write_blocking(|tx| {
        tx.insert_site(&cpl_store::Site {
            id: SITE.into(),
            name: "t".into(),
            kind: SiteKind::Platform,
            owner_tenant_id: None,
            version: 1,
            created_at: 1,
        })
    })?;
    Ok(World {
        store,
        sessions,
        bm,
    })
}

impl World {
    /// A connected site agent heard from at `last_seen`.
    pub(super) fn agent(&self, id: &str, last_seen: i64) -> TestResult {
        self.store.write_blocking(|tx| {
            tx.insert_node(
                &NewNode {
                    id: id.into(),
                    site_id: Some(SITE.into()),
                    pool_id: None,
                    owner_tenant_id: None,
                    role: NodeRole::Site,
                    trust: bc_protocol::Trust::Platform,
                    adapter: bc_protocol::Adapter::BcdV1,
                    drivers: Default::default(),
                    hostname: Some(id.into()),
                    hardware_key: None,
                    hardware_key_trusted: false,
                    identifier_digests: vec![],
                },
                1,
            )?;
            tx.touch_heartbeats(&[(id.to_owned(), 0, last_seen)])?;
            Ok::<_, cpl_store::StoreError>(())
        })?;
        self.sessions.connect(id);
        Ok(())
    }

    pub(super) fn enroll(&self, password: &str) -> Result<String, OpError> {
        self.enroll_as(password, false)
    }

    /// `deployed`: the machine runs its OS already (`nodes.enroll {deployed: true}`).
    fn enroll_as(&self, password: &str, deployed: bool) -> Result<String, OpError> {
        let req = EnrollRequest {
            site_id: SITE.into(),
            pool_id: None,
            name: Some("m1".into()),
            bmc: BmcInput {
                address: format!("redfish+https://127.0.0.1:{}", rand_port()),
                username: "admin".into(),
                password: serde_json::from_value::<Secret>(serde_json::json!(password))
                    .map_err(|e| OpError::Internal(e.to_string()))?,
                tls: TlsMode::Pin,
            },
            macs: None,
            inspect: false,
            deployed,
        };
        let key = Arc::clone(&self.bm.key);
        let n = self
            .store
            .write_blocking(|tx| super::enroll::enroll(tx, &key, &req, "operator:t"))?;
        Ok(n.id)
    }

    pub(super) fn node(&self, id: &str) -> Result<NodeRecord, Box<dyn std::error::Error>> {
        Ok(self
            .store
            .read_blocking(|r| r.node(id))?
            .ok_or("node vanished")?)
    }

    pub(super) fn events(
        &self,
        id: &str,
    ) -> Result<Vec<cpl_store::NodeEvent>, cpl_store::StoreError> {
        self.store.read_blocking(|r| r.events(id))
    }
}

fn rand_port() -> u16 {
    1024 + rand::random::<u16>() % 60000
}

pub(super) fn facts() -> BmcFacts {
    BmcFacts {
        system_path: "/redfish/v1/Systems/1".into(),
        uuid: Some("B26849EF-4FB0-4E03-A9D1-1A165A40C8D7".into()),
        serial: Some("SN-0042-XYZ".into()),
        manufacturer: Some("Sushy".into()),
        model: Some("Emulated".into()),
        nics: vec![BmcNic {
            id: "1".into(),
            mac: "00:25:90:eb:96:28".into(),
        }],
        power: PowerState::On,
        cert_sha256: Some("ab".repeat(32)),
        note: None,
    }
}

pub(super) fn succeeded(id: &str, result: serde_json::Value) -> CommandUpdate {
    CommandUpdate {
        id: id.into(),
        state: bc_protocol::pb::CommandState::Succeeded as i32,
        progress: 100,
        result_json: serde_json::to_vec(&result).unwrap_or_default(),
        error: None,
    }
}

pub(super) fn failed(id: &str, code: &str, message: &str) -> CommandUpdate {
    CommandUpdate {
        id: id.into(),
        state: bc_protocol::pb::CommandState::Failed as i32,
        progress: 100,
        result_json: vec![],
        error: Some(ErrorInfo {
            code: code.into(),
            message: message.into(),
        }),
    }
}

pub(super) fn condition(n: &NodeRecord, t: &str) -> Option<bc_protocol::Condition> {
    n.conditions.iter().find(|c| c.type_ == t).cloned()
}

#[tokio::test]
async fn enrollment_is_verified_by_the_lease_holder_and_stores_digests() -> TestResult {
    let w = world()?;
    let now = now_ms();
    w.agent("node_sa", now)?;
    assert_eq!(w.bm.sweep_leases(now, false).await?, 1);
    let node = w.enroll("pa55-w0rd-one")?;
    let n = w.node(&node)?;
    assert_eq!(n.provision_state, ProvisionState::Enrolling);
    assert_eq!(n.drivers["power"], "redfish");
    assert_eq!(n.role, NodeRole::Unassigned);
    assert_eq!(
        condition(&n, "BmcVerified").map(|c| c.status),
        Some(ConditionStatus::Unknown)
    );
    w.bm.issue_verifications(SITE).await;
    // The holder learns the BMC (with its credentials, in the assignment only) and then gets
    // bmc.verify under epoch 1, about the bare-metal node.
    let a = w.sessions.assignments("node_sa");
    let last = a.last().ok_or("no assignment")?;
    assert!(last.lease_held && last.lease_epoch == 1);
    let ep = last.bmcs[0].endpoint.clone().ok_or("endpoint")?;
    assert_eq!(
        (ep.username.as_str(), ep.password.as_str()),
        ("admin", "pa55-w0rd-one")
    );
    assert!(
        !last.bmcs[0].sync_power,
        "no power sync before verification"
    );
    let cmds = w.sessions.commands("node_sa");
    assert_eq!(cmds.len(), 1);
    let args: serde_json::Value = serde_json::from_slice(&cmds[0].args_json)?;
    assert_eq!(
        args,
        serde_json::json!({"nodeId": node, "leaseEpoch": 1, "candidate": false})
    );
    assert!(!String::from_utf8_lossy(&cmds[0].args_json).contains("pa55"));
    let rec = w.bm.commands.get(&cmds[0].id).await?.ok_or("command")?;
    assert_eq!(rec.subject_node_id.as_deref(), Some(node.as_str()));
    // Issuing again while one is in flight issues nothing.
    w.bm.issue_verifications(SITE).await;
    assert_eq!(w.sessions.commands("node_sa").len(), 1);

    w.bm.commands
        .update(
            "node_sa",
            succeeded(&cmds[0].id, serde_json::to_value(facts())?),
        )
        .await;
    let n = w.node(&node)?;
    assert_eq!(
        n.provision_state,
        ProvisionState::Enrolling,
        "the next issue moves it on"
    );
    assert_eq!(
        condition(&n, "BmcVerified").map(|c| c.status),
        Some(ConditionStatus::True)
    );
    assert_eq!(n.power, Power::On);
    let b = w.store.read_blocking(|r| r.bmc(&node))?.ok_or("bmc")?;
    assert_eq!(
        b.cert_sha256,
        Some("ab".repeat(32)),
        "pinned at first contact"
    );
    assert!(b.identifiers.iter().any(|i| i.kind == "system-serial"
        && i.digest == bc_protocol::hwid::digest("system-serial:sn-0042-xyz")));
    assert_eq!(b.identifiers.len(), 3);
    // The events show the command on the bare-metal node.
    assert!(w.events(&node)?.iter().any(|e| e.kind == "bmcCommand"));
    Ok(())
}

#[tokio::test]
async fn bad_credentials_fail_the_enrollment_and_recover_verifies_again() -> TestResult {
    let w = world()?;
    let now = now_ms();
    w.agent("node_sa", now)?;
    w.bm.sweep_leases(now, false).await?;
    let node = w.enroll("wrong")?;
    w.bm.issue_verifications(SITE).await;
    let cmd = w.sessions.commands("node_sa")[0].id.clone();
    w.bm.commands
        .update(
            "node_sa",
            failed(
                &cmd,
                "BMC_AUTH_FAILED",
                "https://127.0.0.1: 401 Unauthorized: bad creds",
            ),
        )
        .await;
    let n = w.node(&node)?;
    assert_eq!(n.provision_state, ProvisionState::Failed);
    assert_eq!(n.failed_from, Some(ProvisionState::Enrolling));
    assert!(n.maintenance);
    let c = condition(&n, "BmcVerified").ok_or("condition")?;
    assert_eq!(c.status, ConditionStatus::False);
    assert_eq!(c.reason, "BmcAuthFailed");
    assert!(c.message.contains("401 Unauthorized"), "{}", c.message);

    let n = w
        .store
        .write_blocking(|tx| super::abort::recover(tx, &node, n.version, "operator:t"))?;
    assert_eq!(n.provision_state, ProvisionState::Enrolling);
    w.bm.issue_verifications(SITE).await;
    let cmds = w.sessions.commands("node_sa");
    assert_eq!(cmds.len(), 2, "recover verifies again");
    w.bm.commands
        .update(
            "node_sa",
            succeeded(&cmds[1].id, serde_json::to_value(facts())?),
        )
        .await;
    assert_eq!(
        condition(&w.node(&node)?, "BmcVerified").map(|c| c.status),
        Some(ConditionStatus::True)
    );
    Ok(())
}

#[tokio::test]
async fn a_moved_lease_fails_the_old_holders_commands_with_lease_lost() -> TestResult {
    let w = world()?;
    let now = now_ms();
    w.agent("node_a", now)?;
    w.agent("node_b", now)?;
    w.bm.sweep_leases(now, false).await?;
    assert_eq!(w.bm.leases.holder_of(SITE), Some(("node_a".to_owned(), 1)));
    let node = w.enroll("pw")?;
    w.bm.issue_verifications(SITE).await;
    let verify = w.sessions.commands("node_a")[0].id.clone();
    w.bm.commands
        .update("node_a", succeeded(&verify, serde_json::to_value(facts())?))
        .await;
    let power =
        w.bm.power(
            PowerRequest {
                node_id: node.clone().into(),
                version: None,
                action: bc_protocol::commands::bmc::PowerAction::Off,
            },
            "operator:t",
        )
        .await?;
    assert_eq!(power.node_id, "node_a");
    assert_eq!(power.state, CommandState::Sent);

    // node_a dies; within the TTL nothing moves, after it node_b (heard from) takes over.
    w.sessions.drop_session("node_a");
    assert_eq!(w.bm.sweep_leases(now + 5_000, false).await?, 0);
    w.store
        .write_blocking(|tx| tx.touch_heartbeats(&[("node_b".to_owned(), 0, now + 20_000)]))?;
    // During the start-up grace a restart must not flap the lease.
    assert_eq!(w.bm.sweep_leases(now + 20_000, true).await?, 0);
    assert_eq!(w.bm.sweep_leases(now + 20_000, false).await?, 1);
    assert_eq!(w.bm.leases.holder_of(SITE), Some(("node_b".to_owned(), 2)));
    let c = w.bm.commands.get(&power.id).await?.ok_or("command")?;
    assert_eq!(c.state, CommandState::Failed);
    assert_eq!(c.error_code.as_deref(), Some("LEASE_LOST"));
    assert!(
        w.sessions
            .commands("node_b")
            .iter()
            .all(|c| c.id != power.id),
        "never re-sent to the new holder"
    );
    let b = w.sessions.assignments("node_b");
    assert!(
        b.last()
            .is_some_and(|a| a.lease_held && a.lease_epoch == 2 && a.bmcs.len() == 1)
    );
    assert!(
        w.events("node_b")?
            .iter()
            .any(|e| e.kind == "siteLease" && e.to.as_deref() == Some("held"))
    );
    assert!(
        w.events("node_a")?
            .iter()
            .any(|e| e.kind == "siteLease" && e.to.as_deref() == Some("lost"))
    );
    // A late result of the failed command changes nothing.
    w.bm.commands
        .update(
            "node_a",
            succeeded(&power.id, serde_json::json!({"power": "off"})),
        )
        .await;
    let c = w.bm.commands.get(&power.id).await?.ok_or("command")?;
    assert_eq!(c.state, CommandState::Failed);
    Ok(())
}

#[tokio::test]
async fn power_reports_need_the_current_epoch_and_name_out_of_band_changes() -> TestResult {
    let w = world()?;
    let now = now_ms();
    w.agent("node_sa", now)?;
    w.agent("node_zz_standby", now)?;
    w.bm.sweep_leases(now, false).await?;
    let node = w.enroll("pw")?;
    w.bm.issue_verifications(SITE).await;
    let verify = w.sessions.commands("node_sa")[0].id.clone();
    w.bm.commands
        .update(
            "node_sa",
            succeeded(&verify, serde_json::to_value(facts())?),
        )
        .await;
    let obs = |power: &str, reachable: bool, error: &str| PowerReport {
        lease_epoch: 1,
        observations: vec![PowerObservation {
            node_id: node.clone(),
            power: power.into(),
            reachable,
            error: error.into(),
            error_code: String::new(),
            observed_at_ms: now,
        }],
    };
    let version = w.node(&node)?.version;
    // Another epoch, or a standby: ignored.
    let mut stale = obs("off", true, "");
    stale.lease_epoch = 7;
    assert!(matches!(
        w.bm.power_report("node_sa", stale).await,
        ReportOutcome::Ignored(_)
    ));
    assert!(matches!(
        w.bm.power_report("node_zz_standby", obs("off", true, ""))
            .await,
        ReportOutcome::Ignored(_)
    ));
    assert_eq!(w.node(&node)?.power, Power::On);
    // Nobody asked for off: out of band.
    assert_eq!(
        w.bm.power_report("node_sa", obs("off", true, "")).await,
        ReportOutcome::Applied(1)
    );
    let n = w.node(&node)?;
    assert_eq!(n.power, Power::Off);
    assert_eq!(n.version, version, "a report never moves version");
    let last = w
        .events(&node)?
        .into_iter()
        .rev()
        .find(|e| e.kind == "power");
    assert!(last.is_some_and(|e| e.message.starts_with("out-of-band")));
    // Asked for on: not out of band.
    w.bm.power(
        PowerRequest {
            node_id: node.clone().into(),
            version: None,
            action: bc_protocol::commands::bmc::PowerAction::On,
        },
        "operator:t",
    )
    .await?;
    w.bm.power_report("node_sa", obs("on", true, "")).await;
    let last = w
        .events(&node)?
        .into_iter()
        .rev()
        .find(|e| e.kind == "power");
    assert!(last.is_some_and(|e| !e.message.contains("out-of-band")));
    // The BMC stops answering, then answers again.
    w.bm.power_report(
        "node_sa",
        obs("unknown", false, "connect: connection refused"),
    )
    .await;
    let n = w.node(&node)?;
    assert_eq!(n.power, Power::Unknown);
    let c = condition(&n, "BmcReachable").ok_or("condition")?;
    assert_eq!(c.status, ConditionStatus::False);
    assert!(c.message.contains("connection refused"));
    w.bm.power_report("node_sa", obs("on", true, "")).await;
    let n = w.node(&node)?;
    assert_eq!(
        condition(&n, "BmcReachable").map(|c| c.status),
        Some(ConditionStatus::True)
    );
    assert_eq!(n.power, Power::On);
    Ok(())
}

#[tokio::test]
async fn a_rotation_replaces_the_credentials_only_when_the_bmc_accepts_them() -> TestResult {
    let w = world()?;
    let now = now_ms();
    w.agent("node_sa", now)?;
    w.bm.sweep_leases(now, false).await?;
    let node = w.enroll("old-pass")?;
    w.bm.issue_verifications(SITE).await;
    let verify = w.sessions.commands("node_sa")[0].id.clone();
    w.bm.commands
        .update(
            "node_sa",
            succeeded(&verify, serde_json::to_value(facts())?),
        )
        .await;
    let stored = |w: &World| -> Result<String, Box<dyn std::error::Error>> {
        let b = w.store.read_blocking(|r| r.bmc(&node))?.ok_or("bmc")?;
        Ok(w.bm.key.open(&node, &b.credentials)?.password)
    };
    for (answer, want) in [(false, "old-pass"), (true, "new-pass-2")] {
        let version = w.node(&node)?.version;
        let bm = w.bm.clone();
        let req = UpdateBmcCredentialsRequest {
            node_id: node.clone().into(),
            version,
            username: "admin".into(),
            password: serde_json::from_value(serde_json::json!(if answer {
                "new-pass-2"
            } else {
                "new-pass-1"
            }))?,
        };
        let verb = tokio::spawn(async move { bm.update_credentials(req, "operator:t").await });
        // The candidate travels in the assignment, next to the current pair.
        let cmd = loop {
            let open = w.sessions.commands("node_sa").into_iter().find(|c| {
                let a: serde_json::Value = serde_json::from_slice(&c.args_json).unwrap_or_default();
                a["candidate"] == true
                    && w.store
                        .read_blocking(|r| r.command(&c.id))
                        .ok()
                        .flatten()
                        .is_some_and(|r| !r.state.is_final())
            });
            if let Some(c) = open {
                break c;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let a = w.sessions.assignments("node_sa");
        let m = &a.last().ok_or("assignment")?.bmcs[0];
        assert_eq!(
            m.endpoint.as_ref().map(|e| e.password.as_str()),
            Some(stored(&w)?.as_str()),
            "the current pair stays in use while the candidate is tested"
        );
        assert!(m.candidate.is_some());
        let update = if answer {
            succeeded(&cmd.id, serde_json::to_value(facts())?)
        } else {
            failed(&cmd.id, "BMC_AUTH_FAILED", "401 Unauthorized")
        };
        w.bm.commands.update("node_sa", update).await;
        let r = verb.await?;
        assert_eq!(r.is_ok(), answer, "{r:?}");
        if let Err(e) = r {
            assert!(e.to_string().contains("BMC_AUTH_FAILED"), "{e}");
        }
        assert_eq!(stored(&w)?, want);
        let a = w.sessions.assignments("node_sa");
        let m = &a.last().ok_or("assignment")?.bmcs[0];
        assert!(m.candidate.is_none());
        assert_eq!(m.endpoint.as_ref().map(|e| e.password.as_str()), Some(want));
    }
    Ok(())
}

#[tokio::test]
async fn a_site_without_a_holder_queues_the_verification_until_its_deadline() -> TestResult {
    let w = world()?;
    let node = w.enroll("pw")?;
    w.bm.verification_pass(now_ms()).await;
    assert_eq!(w.node(&node)?.provision_state, ProvisionState::Enrolling);
    w.bm.verification_pass(now_ms() + 61_000).await;
    let n = w.node(&node)?;
    assert_eq!(n.provision_state, ProvisionState::Failed);
    let c = condition(&n, "BmcVerified").ok_or("condition")?;
    assert_eq!(c.reason, "NoSiteAgent");
    assert_eq!(n.connectivity, Connectivity::Disconnected);
    Ok(())
}

#[tokio::test]
async fn a_machine_enrolled_as_deployed_keeps_its_os_and_is_never_booted() -> TestResult {
    let w = world()?;
    let now = now_ms();
    w.agent("node_sa", now)?;
    w.bm.sweep_leases(now, false).await?;
    let node = w.enroll_as("pa55-w0rd-one", true)?;
    w.bm.issue_verifications(SITE).await;
    let cmds = w.sessions.commands("node_sa");
    assert_eq!(cmds.len(), 1, "bmc.verify only");
    w.bm.commands
        .update(
            "node_sa",
            succeeded(&cmds[0].id, serde_json::to_value(facts())?),
        )
        .await;
    let n = w.node(&node)?;
    assert_eq!(n.provision_state, ProvisionState::Deployed);
    assert_eq!(
        n.power,
        Power::On,
        "its power is managed from the BMC's answer"
    );
    let moves: Vec<String> = w
        .events(&node)?
        .into_iter()
        .filter(|e| e.kind == "provisionState")
        .map(|e| e.message)
        .collect();
    assert!(
        moves
            .iter()
            .any(|m| m.contains("enrolled as already deployed")),
        "{moves:?}"
    );
    // No boot is begun and nothing is powered: the machine is not in a ramdisk state.
    w.bm.boot_pass(now_ms()).await;
    assert!(w.store.read_blocking(|r| r.boot(&node))?.is_none());
    assert_eq!(w.sessions.commands("node_sa").len(), 1);
    Ok(())
}

/// The verbs' and reports' core over the world's store, sessions and bare-metal service.
pub(super) fn core_of(w: &World) -> crate::verbs::Core {
    crate::verbs::Core {
        store: w.store.clone(),
        commands: w.bm.commands.clone(),
        bare_metal: w.bm.clone(),
        sessions: Arc::clone(&w.sessions) as Arc<dyn AgentSessions>,
        issuer: crate::verbs::TokenIssuer {
            ca_pin: "sha256:00".into(),
            control_plane: "https://127.0.0.1:1".into(),
        },
        replica: crate::status::ReplicaIdentity {
            id: "gw-test".into(),
            gateway_url: "https://127.0.0.1:1".into(),
        },
    }
}

#[tokio::test]
async fn a_verification_reported_over_to_the_core_sends_the_holder_its_new_assignment() -> TestResult
{
    use crate::agent_report::{AgentReport, Effect};
    let w = world()?;
    let now = now_ms();
    w.agent("node_sa", now)?;
    w.bm.sweep_leases(now, false).await?;
    w.enroll("pa55-w0rd-one")?;
    w.bm.issue_verifications(SITE).await;
    let cmds = w.sessions.commands("node_sa");
    let id = cmds.first().map(|c| c.id.clone()).ok_or("no bmc.verify")?;
    let before = w.sessions.assignments("node_sa").len();
    let core = core_of(&w);
    let running = CommandUpdate {
        id: id.clone(),
        state: bc_protocol::pb::CommandState::Running.into(),
        ..Default::default()
    };
    let e = core
        .report("node_sa", 1, AgentReport::CommandUpdate(running))
        .await?;
    assert_eq!(e, vec![Effect::Recorded]);
    assert_eq!(w.sessions.assignments("node_sa").len(), before);
    let done = succeeded(&id, serde_json::to_value(facts())?);
    let e = core
        .report("node_sa", 1, AgentReport::CommandUpdate(done))
        .await?;
    assert_eq!(
        e,
        vec![Effect::Recorded, Effect::AssignmentSent("node_sa".into())]
    );
    let a = w.sessions.assignments("node_sa");
    assert_eq!(a.len(), before + 1, "the ended verification's assignment");
    assert!(
        a.last().is_some_and(|a| a.bmcs[0].sync_power),
        "a verified BMC is synced from now on"
    );
    Ok(())
}
