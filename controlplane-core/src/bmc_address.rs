//! The Inventory controller's `BmcAddressMismatch` condition (issue 20.4): the BMC the host sees
//! in band against the BMC the node was enrolled through.
//!
//! The evidence is the inventory document's `bmc.lan[].ipAddress` (Get LAN Configuration
//! Parameters through the host's `/dev/ipmi0`, docs/inventory.md "BMC") and the host of the
//! node's `node_bmcs.address` (`redfish+https://10.0.0.5`, `ipmi://10.0.0.5:623`). A mismatch
//! means the enrollment points at another machine's BMC, or the BMC moved: power commands would
//! act on the wrong machine, so it is said, never smoothed over.
//!
//! - `true`, reason `AddressDiffers`: the enrolled host is an IP address that none of the BMC's
//!   LAN channels has.
//! - `false`, reason `AddressMatches`: one LAN channel has the enrolled address.
//! - `unknown`, reason `EnrolledByName`: the enrollment names the BMC by DNS name; the control
//!   plane does not resolve names to judge (the answer depends on whose resolver), so it says
//!   what the host saw and leaves the judgement to the operator.
//! - absent: the node has no BMC enrollment, or the document reports no LAN address (no
//!   `/dev/ipmi0`, a VM, an agent before issue 20). A condition set before stays as it was.
//!
//! Informational: it never enters `noScheduleReasons` (a node runs work whatever its BMC).

use std::net::IpAddr;

use bc_protocol::ConditionStatus;
use bc_protocol::inventory::Bmc;

use crate::conditions::{ConditionUpdate, apply};
use crate::edit::Edit;
use crate::error::OpError;
use cpl_store::Tx;

/// The condition type.
pub const CONDITION: &str = "BmcAddressMismatch";
/// Reason of a `true` condition.
pub const REASON_DIFFERS: &str = "AddressDiffers";
/// Reason of a `false` condition.
pub const REASON_MATCHES: &str = "AddressMatches";
/// Reason of an `unknown` condition.
pub const REASON_BY_NAME: &str = "EnrolledByName";

/// The condition for an enrolled `address` (as stored) and what the host reported; `None` when
/// the report has no LAN address or the address does not parse.
pub fn address_condition(address: &str, bmc: &Bmc) -> Option<ConditionUpdate> {
    let seen: Vec<&str> = bmc.lan_addresses().collect();
    if seen.is_empty() {
        return None;
    }
    let host = crate::bare_metal::address::parse(address).ok()?.host;
    let make = |status, reason: &str, message: String| ConditionUpdate {
        type_: CONDITION.to_owned(),
        status,
        reason: reason.to_owned(),
        message,
        owner: "Inventory".to_owned(),
        gpus: Vec::new(),
    };
    let seen_text = bmc
        .lan
        .iter()
        .filter_map(|c| {
            c.ip_address
                .as_deref()
                .map(|a| format!("{a} (channel {})", c.channel))
        })
        .collect::<Vec<_>>()
        .join(", ");
    let Ok(enrolled) = host.parse::<IpAddr>() else {
        return Some(make(
            ConditionStatus::Unknown,
            REASON_BY_NAME,
            format!(
                "enrolled through the name {host}; the host's BMC reports {seen_text} (not resolved here)"
            ),
        ));
    };
    let matches = seen
        .iter()
        .any(|a| a.parse::<IpAddr>().is_ok_and(|ip| ip == enrolled));
    Some(if matches {
        make(
            ConditionStatus::False,
            REASON_MATCHES,
            format!("the host's BMC has the enrolled address {enrolled}"),
        )
    } else {
        make(
            ConditionStatus::True,
            REASON_DIFFERS,
            format!(
                "enrolled through {enrolled}, but the host's BMC reports {seen_text}: the enrollment may point at another machine's BMC"
            ),
        )
    })
}

/// Re-derives the condition on `edit` from its stored inventory and its BMC enrollment. Reads
/// the enrollment only when the document may hold a LAN address and changed (or the condition
/// is missing): an identical report stays cheap. Errors: the store.
pub fn refresh(tx: &Tx<'_>, edit: &mut Edit, document_changed: bool) -> Result<(), OpError> {
    let present = edit.node.conditions.iter().any(|c| c.type_ == CONDITION);
    let may_have_lan = edit
        .node
        .inventory_json
        .as_deref()
        .is_some_and(|j| j.contains("\"ipAddress\""));
    if !may_have_lan || (!document_changed && present) {
        return Ok(());
    }
    let Some(record) = tx.bmc(&edit.node.id)? else {
        return Ok(());
    };
    let update = crate::inventory::of(&edit.node)
        .and_then(|inv| inv.bmc)
        .and_then(|bmc| address_condition(&record.address, &bmc));
    if let Some(update) = update {
        apply(edit, &update);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bc_protocol::inventory::BmcLanChannel;

    fn bmc(addrs: &[(u8, &str)]) -> Bmc {
        Bmc {
            lan: addrs
                .iter()
                .map(|(ch, a)| BmcLanChannel {
                    channel: *ch,
                    ip_address: Some((*a).to_owned()),
                    ..BmcLanChannel::default()
                })
                .collect(),
            ..Bmc::default()
        }
    }

    use crate::test_utils::TestResult;

    #[test]
    fn the_enrolled_address_on_any_lan_channel_matches() -> TestResult {
        let c = address_condition(
            "redfish+https://10.0.0.5/redfish/v1/Systems/1",
            &bmc(&[(1, "192.168.0.2"), (8, "10.0.0.5")]),
        )
        .ok_or("condition")?;
        assert_eq!(c.status, ConditionStatus::False);
        assert_eq!(c.reason, REASON_MATCHES);
        Ok(())
    }

    #[test]
    fn another_address_is_a_mismatch_naming_both() -> TestResult {
        let c = address_condition("ipmi://10.0.0.5:623", &bmc(&[(1, "10.0.0.9")]))
            .ok_or("condition")?;
        assert_eq!(c.status, ConditionStatus::True);
        assert_eq!(c.reason, REASON_DIFFERS);
        assert!(c.message.contains("10.0.0.5"), "{}", c.message);
        assert!(c.message.contains("10.0.0.9 (channel 1)"), "{}", c.message);
        Ok(())
    }

    #[test]
    fn ipv6_is_compared_as_an_address_not_as_text() -> TestResult {
        let c =
            address_condition("ipmi://[fd00::0:5]", &bmc(&[(1, "fd00::5")])).ok_or("condition")?;
        assert_eq!(c.status, ConditionStatus::False);
        Ok(())
    }

    #[test]
    fn a_name_is_not_resolved_and_says_so() -> TestResult {
        let c = address_condition("redfish+https://bmc-17.example", &bmc(&[(1, "10.0.0.9")]))
            .ok_or("condition")?;
        assert_eq!(c.status, ConditionStatus::Unknown);
        assert_eq!(c.reason, REASON_BY_NAME);
        Ok(())
    }

    /// Through `record_inventory`: a node enrolled at 10.0.0.5 reports its BMC at 10.0.0.9, then
    /// at 10.0.0.5; a node without an enrollment gets no condition.
    #[test]
    fn an_inventory_report_sets_and_clears_the_condition() -> crate::test_utils::TestResult {
        use crate::reports::{InventoryReport, record_inventory};
        use crate::sessions::{self, SessionOpen};
        let store = cpl_store::testing::store()?;
        store.write_blocking(|tx| -> crate::test_utils::TestResult {
            let mut epochs = Vec::new();
            for id in ["enrolled", "plain"] {
                crate::test_utils::node(tx, id, None)?;
                let open = SessionOpen {
                    node_id: id.into(),
                    gateway_id: "gw".into(),
                    boot_id: "b".into(),
                    agent_version: "1".into(),
                };
                epochs.push(sessions::open(tx, &open)?.ok_or("session")?.epoch);
            }
            tx.put_bmc(&cpl_store::BmcRecord {
                node_id: "enrolled".into(),
                address: "ipmi://10.0.0.5:623".into(),
                tls: "pin".into(),
                credentials: "sealed".into(),
                candidate: None,
                cert_sha256: None,
                facts: None,
                identifiers: vec![],
                macs: vec![],
                verified_at: None,
                verify_command_id: None,
                verify_started_at: None,
                last_error: None,
                power_expected: None,
                power_expected_at: None,
                reachable: None,
                created_at: 1,
                inspect: false,
                deployed: false,
                deployment: None,
                rescue: None,
            })?;
            let doc = |ip: &str| {
                format!(
                    r#"{{"schemaVersion": 1, "bmc": {{"firmware": "1.0", "lan": [{{"channel": 1, "ipAddress": "{ip}"}}]}}}}"#
                )
            };
            let report = |id: &str, epoch: u64, d: &str| -> Result<Option<bc_protocol::Condition>, OpError> {
                let r = InventoryReport {
                    hardware_key: "",
                    trusted: false,
                    digests: &[],
                    document: d.as_bytes(),
                    sha256: d,
                };
                record_inventory(tx, id, epoch, &r)?;
                Ok(tx
                    .node(id)?
                    .and_then(|n| n.conditions.into_iter().find(|c| c.type_ == CONDITION)))
            };
            let c = report("enrolled", epochs[0], &doc("10.0.0.9"))?.ok_or("set")?;
            assert_eq!((c.status, c.reason.as_str()), (ConditionStatus::True, REASON_DIFFERS));
            let c = report("enrolled", epochs[0], &doc("10.0.0.5"))?.ok_or("kept")?;
            assert_eq!((c.status, c.reason.as_str()), (ConditionStatus::False, REASON_MATCHES));
            assert!(report("plain", epochs[1], &doc("10.0.0.9"))?.is_none());
            Ok(())
        })
    }

    #[test]
    fn no_lan_address_gives_no_condition() {
        assert!(address_condition("ipmi://10.0.0.5", &Bmc::default()).is_none());
        let no_ip = Bmc {
            lan: vec![BmcLanChannel {
                channel: 1,
                ..BmcLanChannel::default()
            }],
            ..Bmc::default()
        };
        assert!(address_condition("ipmi://10.0.0.5", &no_ip).is_none());
    }
}
