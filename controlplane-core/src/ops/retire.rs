//! `nodes.retire`: takes a node out of service for good (spec "Provision states": `retiring ->
//! retired`). A node with no BMC — an adopted server you already run, or one that failed while
//! adopting — has no bare-metal teardown to wait for: it goes `-> retiring -> retired` in one
//! save. A machine enrolled through its BMC (`ready`, `deployed` or `failed`) goes to
//! `retiring`, where the retire workflow boots the ramdisk and cleans its disks
//! (`bare_metal::release`). Either way the node's identity ends (`identityGeneration + 1`): a
//! retired node holds none, so its old certificate is refused. Any other state is
//! `INVALID_STATE` from the one provision table.

use bc_protocol::ProvisionState;
use cpl_store::{NodeRecord, Tx};

use crate::edit::Edit;
use crate::error::OpError;
use crate::ops::nodes::{apply_transition, bump_identity, refuse_while_allocated};

/// `nodes.retire`. Refused (`INVALID_STATE`) while the node holds allocations.
pub fn retire(
    tx: &Tx<'_>,
    node_id: &str,
    expected_version: u64,
    actor: &str,
) -> Result<NodeRecord, OpError> {
    let mut edit = Edit::begin(tx, node_id, Some(expected_version), actor)?;
    refuse_while_allocated(tx, node_id, "drain it before retiring it")?;
    if tx.bmc(node_id)?.is_some() {
        crate::bare_metal::release::start_retire(tx, &mut edit)?;
        return edit.save(tx);
    }
    apply_transition(&mut edit, ProvisionState::Retiring, "nodes.retire")?;
    apply_transition(
        &mut edit,
        ProvisionState::Retired,
        "nodes.retire: a node without a BMC has nothing to tear down",
    )?;
    bump_identity(&mut edit, "nodes.retire: a retired node holds no identity");
    edit.save(tx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_utils::{node, ready_host};

    #[test]
    fn an_adopted_node_is_retired_and_others_follow_the_table() -> Result<(), OpError> {
        let store = cpl_store::testing::store()?;
        store.write_blocking(|tx| -> Result<(), OpError> {
            node(tx, "node_a", None)?;
            let a = ready_host(tx, "node_a", 2)?;
            let r = retire(tx, "node_a", a.version, "operator:t")?;
            assert_eq!(r.provision_state, ProvisionState::Retired);
            let moves: Vec<(Option<String>, Option<String>)> = tx
                .events("node_a")?
                .into_iter()
                .filter(|e| e.kind == "provisionState")
                .map(|e| (e.from, e.to))
                .collect();
            assert_eq!(
                &moves[moves.len() - 2..],
                [
                    (Some("adopted".into()), Some("retiring".into())),
                    (Some("retiring".into()), Some("retired".into()))
                ]
            );
            // Retired is terminal; adopting has no edge to retiring.
            let again = retire(tx, "node_a", r.version, "operator:t");
            assert!(matches!(again, Err(OpError::InvalidTransition { .. })));
            let b = node(tx, "node_b", None)?;
            let adopting = retire(tx, "node_b", b.version, "operator:t");
            assert!(matches!(adopting, Err(OpError::InvalidTransition { .. })));
            Ok(())
        })
    }
}
