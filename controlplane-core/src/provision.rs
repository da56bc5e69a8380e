//! `provisionStateTable`: the one table of legal `provisionState` moves (spec "Provision states").
//!
//! The spec's diagram gives the main paths: a server you already run joins as `adopting` and
//! becomes `adopted` once acceptance passes; a bare-metal server goes `enrolling -> inspecting ->
//! commissioning -> ready -> deploying -> deployed -> releasing -> ready`, and `retiring -> retired`
//! (from `ready`, and from `adopted`: an adopted server is retired like any other).
//! The edges the diagram leaves out are in the table too: every workflow state can go to `failed`,
//! `failed` can recover (only back to the state it failed from, kept in `failedFrom`) or be
//! retired whatever it failed in, `deployed` can enter `rescue` (and leave it back to
//! `deployed`) or be retired (the retire workflow cleans it first), and an enrollment of a
//! machine that already runs its OS goes `enrolling -> deployed` (issue 16).

use bc_protocol::ProvisionState::{self, *};

use crate::error::OpError;

/// States in which a workflow is running; each of them can fail (spec: "every workflow state can
/// fail"). `rescue` counts: it boots a rescue image, which can fail like any other workflow.
pub const WORKFLOW_STATES: &[ProvisionState] = &[
    Adopting,
    Enrolling,
    Inspecting,
    Commissioning,
    Deploying,
    Releasing,
    Rescue,
    Retiring,
];

/// Every legal move, `from -> [to, ...]`, one row per state, in the spec's order. The `failed`
/// row lists every state a failed node may recover to; [`transition`] narrows it to `failedFrom`.
pub const PROVISION_STATE_TABLE: &[(ProvisionState, &[ProvisionState])] = &[
    (Adopting, &[Adopted, Failed]),
    (Adopted, &[Retiring]),
    (Enrolling, &[Inspecting, Deployed, Failed]),
    (Inspecting, &[Commissioning, Failed]),
    (Commissioning, &[Ready, Failed]),
    (Ready, &[Deploying, Inspecting, Retiring]),
    (Deploying, &[Deployed, Failed]),
    (Deployed, &[Releasing, Rescue, Retiring]),
    (Releasing, &[Ready, Failed]),
    (Rescue, &[Deployed, Failed]),
    (Failed, WORKFLOW_STATES),
    (Retiring, &[Retired, Failed]),
    (Retired, &[]),
];

/// The table's targets from `from` (empty for a terminal state).
pub fn targets(from: ProvisionState) -> &'static [ProvisionState] {
    PROVISION_STATE_TABLE
        .iter()
        .find(|(f, _)| *f == from)
        .map(|(_, to)| *to)
        .unwrap_or(&[])
}

/// What a legal move writes besides `provisionState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    pub to: ProvisionState,
    /// The new `failedFrom`: the state failed from when entering `failed`, `None` otherwise
    /// (recovering clears it).
    pub failed_from: Option<ProvisionState>,
    /// Whether the move turns `maintenance` on (spec: "A failure records failedFrom and turns
    /// maintenance on"). Nothing here turns it off: maintenance is its own axis.
    pub maintenance_on: bool,
}

/// Checks `from -> to` against [`PROVISION_STATE_TABLE`]. `failed_from` is the node's current
/// `failedFrom`; a move out of `failed` is legal only back to it, or to `retiring` (a machine
/// that failed in any workflow can still be retired).
///
/// Errors: [`OpError::InvalidTransition`] naming `from` and `to`.
pub fn transition(
    from: ProvisionState,
    failed_from: Option<ProvisionState>,
    to: ProvisionState,
) -> Result<Transition, OpError> {
    let listed = targets(from).contains(&to);
    let legal = listed && (from != Failed || failed_from == Some(to) || to == Retiring);
    if !legal {
        return Err(OpError::InvalidTransition { from, to });
    }
    Ok(Transition {
        to,
        failed_from: (to == Failed).then_some(from),
        maintenance_on: to == Failed,
    })
}

/// The table as a Mermaid state diagram (`stateDiagram-v2`), one line per edge in the table's
/// order; `failed`'s edges are labelled with what makes them legal. `docs/bare-metal.md` holds
/// this text between its `provision-state-diagram` markers (a test keeps them equal).
pub fn state_diagram() -> String {
    let mut out = String::from("stateDiagram-v2\n");
    out.push_str("    [*] --> adopting: a server you run joins\n");
    out.push_str("    [*] --> enrolling: nodes.enroll\n");
    for (from, tos) in PROVISION_STATE_TABLE {
        for to in *tos {
            let label = match (*from, *to) {
                (Failed, Retiring) => ": nodes.retire",
                (Failed, _) => ": nodes.recover (failedFrom)",
                _ => "",
            };
            out.push_str(&format!("    {from} --> {to}{label}\n"));
        }
    }
    out.push_str("    retired --> [*]: nodes.delete\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_invalid(r: Result<Transition, OpError>, from: ProvisionState, to: ProvisionState) {
        match r {
            Err(OpError::InvalidTransition { from: f, to: t }) => {
                assert_eq!((f, t), (from, to));
            }
            other => panic!("{from} -> {to}: expected InvalidTransition, got {other:?}"),
        }
    }

    #[test]
    fn table_has_one_row_per_state_in_declaration_order() {
        let rows: Vec<ProvisionState> = PROVISION_STATE_TABLE.iter().map(|(f, _)| *f).collect();
        assert_eq!(rows, ProvisionState::ALL.to_vec());
    }

    /// The exact edge set, written out independently of the table: any edit of the table must
    /// edit this list too.
    const EXPECTED_EDGES: &[(ProvisionState, ProvisionState)] = &[
        (Adopting, Adopted),
        // Issue 18 item 9: an adopted node is retired like any other.
        (Adopted, Retiring),
        (Enrolling, Inspecting),
        // Issue 16 item 6: a machine that already runs its OS is enrolled as deployed.
        (Enrolling, Deployed),
        (Inspecting, Commissioning),
        (Commissioning, Ready),
        (Ready, Deploying),
        (Ready, Inspecting),
        (Ready, Retiring),
        (Deploying, Deployed),
        (Deployed, Releasing),
        (Deployed, Rescue),
        (Deployed, Retiring),
        (Rescue, Deployed),
        (Releasing, Ready),
        (Retiring, Retired),
    ];

    #[test]
    fn every_pair_is_legal_exactly_when_the_spec_says() {
        for &from in ProvisionState::ALL {
            for &to in ProvisionState::ALL {
                let failing = to == Failed && WORKFLOW_STATES.contains(&from);
                let expected = EXPECTED_EDGES.contains(&(from, to)) || failing;
                if from == Failed {
                    continue; // covered below: depends on failedFrom
                }
                let r = transition(from, None, to);
                if expected {
                    let t = r.unwrap_or_else(|e| panic!("{from} -> {to} must be legal: {e}"));
                    assert_eq!(t.to, to);
                    assert_eq!(t.maintenance_on, to == Failed, "{from} -> {to}");
                    assert_eq!(t.failed_from, failing.then_some(from), "{from} -> {to}");
                } else {
                    is_invalid(r, from, to);
                }
            }
        }
    }

    #[test]
    fn every_workflow_state_fails_and_recovers_only_to_where_it_failed_from() {
        for &w in WORKFLOW_STATES {
            let t = transition(w, None, Failed).unwrap_or_else(|e| panic!("{w} must fail: {e}"));
            assert_eq!(t.failed_from, Some(w));
            assert!(t.maintenance_on);
            for &to in ProvisionState::ALL {
                let r = transition(Failed, Some(w), to);
                if to == w || to == Retiring {
                    let back = r.unwrap_or_else(|e| panic!("recover to {w}: {e}"));
                    assert_eq!(back.failed_from, None);
                    assert!(!back.maintenance_on);
                } else {
                    is_invalid(r, Failed, to);
                }
            }
        }
    }

    #[test]
    fn settled_states_cannot_fail() {
        for s in [Adopted, Ready, Deployed, Failed, Retired] {
            is_invalid(transition(s, None, Failed), s, Failed);
        }
    }

    #[test]
    fn failed_without_failed_from_can_only_be_retired() {
        for &to in ProvisionState::ALL {
            let r = transition(Failed, None, to);
            if to == Retiring {
                assert!(r.is_ok(), "failed -> retiring: {r:?}");
            } else {
                is_invalid(r, Failed, to);
            }
        }
    }

    #[test]
    fn invalid_state_message_names_from_and_to() {
        let e = transition(Retired, None, Ready).err();
        let msg = e.as_ref().map(ToString::to_string).unwrap_or_default();
        assert!(msg.contains("retired") && msg.contains("ready"), "{msg}");
        assert_eq!(
            e.map(|e| e.code()),
            Some(bc_protocol::ErrorCode::InvalidState)
        );
    }

    /// `docs/bare-metal.md`'s diagram is the table's: with `BC_UPDATE_DOCS=1` the test writes
    /// it there instead of failing.
    #[test]
    fn the_docs_state_diagram_is_generated_from_the_table() -> Result<(), std::io::Error> {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/bare-metal.md");
        let doc = std::fs::read_to_string(path)?;
        let (begin, end) = (
            "<!-- provision-state-diagram:begin (generated: cargo test -p cpl-core state_diagram with BC_UPDATE_DOCS=1) -->\n```mermaid\n",
            "```\n<!-- provision-state-diagram:end -->",
        );
        let (Some(b), Some(e)) = (doc.find(begin), doc.find(end)) else {
            panic!("docs/bare-metal.md has no provision-state-diagram markers");
        };
        let have = &doc[b + begin.len()..e];
        let want = state_diagram();
        if have != want {
            if std::env::var("BC_UPDATE_DOCS").as_deref() == Ok("1") {
                let new = format!("{}{want}{}", &doc[..b + begin.len()], &doc[e..]);
                return std::fs::write(path, new);
            }
            panic!(
                "docs/bare-metal.md's state diagram is stale; run with BC_UPDATE_DOCS=1:\n{want}"
            );
        }
        assert!(want.contains("    failed --> retiring: nodes.retire\n"));
        assert!(want.contains("    deployed --> rescue\n"));
        Ok(())
    }

    #[test]
    fn docs_table_matches_the_code() -> Result<(), std::io::Error> {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/node-model.md");
        let doc = std::fs::read_to_string(path)?;
        for (from, to) in PROVISION_STATE_TABLE {
            let prefix = format!("| {from} | ");
            let line = doc
                .lines()
                .find(|l| l.starts_with(&prefix))
                .unwrap_or_else(|| panic!("docs/node-model.md has no row for {from}"));
            let names: Vec<&str> = to.iter().map(|s| s.as_str()).collect();
            let want = if *from == Failed {
                format!(
                    "failedFrom (one of: {}), or retiring whatever it failed in",
                    names.join(", ")
                )
            } else if names.is_empty() {
                "—".to_owned()
            } else {
                names.join(", ")
            };
            assert_eq!(line, format!("{prefix}{want} |"), "row {from}");
        }
        Ok(())
    }
}
