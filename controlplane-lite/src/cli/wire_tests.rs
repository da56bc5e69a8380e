//! `bcctl` sends the typed request of each method, and the server reads it as it read the JSON
//! body `bcctl` wrote by hand before (issue 29). Each case parses a command line, builds what it
//! sends (a mutation at the node's version, 7 unless `--version` says otherwise) and checks:
//! - the request goes to the method expected;
//! - the server's decoder ([`Method::decode`]) reads the old hand-written body into this very
//!   request (so nothing the server sees changed);
//! - the request serialized decodes back to itself (a field renamed on either side fails).
//!
//! Every method of the API has at least one case.

use std::collections::BTreeSet;

use clap::Parser;
use cpl_core::verbs::{Method, Request};
use serde_json::{Value, json};

use super::wire_cases::{Files, bare_metal_cases, fleet_cases, node_cases};
use crate::{Cli, Command};

/// The node's version a mutation without `--version` is sent at.
pub(super) const CURRENT: u64 = 7;

/// What `bcctl <argv>` sends.
fn sent(argv: &[&str]) -> Result<Request, String> {
    let cli = Cli::try_parse_from(std::iter::once("bcctl").chain(argv.iter().copied()))
        .map_err(|e| format!("{argv:?}: {e}"))?;
    let call = match cli.command {
        Command::Nodes { cmd, .. } => super::nodes::call(cmd).map_err(|e| e.to_string())?,
        Command::Pools { cmd, .. } => super::ops::pools_call(cmd),
        Command::Sites { cmd, .. } => super::ops::sites_call(cmd),
        Command::Tokens { cmd, .. } => super::ops::tokens_call(cmd),
        Command::Allocations { cmd, .. } => super::ops::allocations_call(cmd),
        Command::Commands { cmd, .. } => super::ops::commands_call(cmd),
        Command::Remediations { cmd, .. } => super::remediation::remediations_call(cmd),
        Command::Status { .. } => super::call::Call::once(super::status::request()),
        Command::Serve(_)
        | Command::Dev(_)
        | Command::Bench(_)
        | Command::Completions(_)
        | Command::Man(_) => {
            return Err(format!("{argv:?} is not an operator verb"));
        }
    };
    Ok(call.at(call.given_version().unwrap_or(CURRENT)))
}

/// Checks one case; returns the method it covered.
fn check(argv: &[&str], method: Method, old_body: Value) -> Result<Method, String> {
    let req = sent(argv)?;
    if req.method() != method {
        return Err(format!("{argv:?} goes to {}, not {method}", req.method()));
    }
    let old = method
        .decode(old_body.clone())
        .map_err(|e| format!("{argv:?}: the old body {old_body} does not decode: {e}"))?;
    if old != req {
        return Err(format!(
            "{argv:?}: the server read the old body as {old:?}, bcctl now sends {req:?}"
        ));
    }
    let wire = serde_json::to_value(&req).map_err(|e| e.to_string())?;
    let back = method
        .decode(wire.clone())
        .map_err(|e| format!("{argv:?}: what bcctl sends ({wire}) does not decode: {e}"))?;
    if back != req {
        return Err(format!("{argv:?}: {wire} decodes as {back:?}"));
    }
    Ok(method)
}

#[test]
fn every_verb_sends_what_the_server_read_before() -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let files = Files {
        password: dir.path().join("pw").display().to_string(),
        user_data: dir.path().join("user-data").display().to_string(),
    };
    std::fs::write(&files.password, "s3cr3t\n").map_err(|e| e.to_string())?;
    std::fs::write(&files.user_data, "#cloud-config\n").map_err(|e| e.to_string())?;
    let cases = node_cases()
        .into_iter()
        .chain(bare_metal_cases(&files))
        .chain(fleet_cases());
    let mut covered = BTreeSet::new();
    let mut failures = Vec::new();
    for case in cases {
        let argv: Vec<&str> = case.argv.iter().map(String::as_str).collect();
        match check(&argv, case.method, case.old_body) {
            Ok(m) => {
                covered.insert(m.name());
            }
            Err(e) => failures.push(e),
        }
    }
    let missing: Vec<&str> = Method::ALL
        .iter()
        .map(|m| m.name())
        .filter(|m| !covered.contains(m))
        .collect();
    if !missing.is_empty() {
        failures.push(format!("methods without a case: {missing:?}"));
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n"))
    }
}

/// A string that breaks its rule goes out as given: the server refuses it while decoding, with
/// the message it gave before (`bcctl` checks nothing of its own; the e2e test of labels wants
/// the API's `INVALID_ARGUMENT`).
#[test]
fn a_bad_string_reaches_the_server_and_is_refused_there() -> Result<(), String> {
    let req = sent(&["nodes", "set-labels", "n1", "_bad=x"])?;
    let old = Method::NodesSetLabels
        .decode(json!({"nodeId": "n1", "version": CURRENT, "labels": {"_bad": "x"}}))
        .err()
        .map(|e| e.to_string());
    let wire = serde_json::to_value(&req).map_err(|e| e.to_string())?;
    let new = Method::NodesSetLabels
        .decode(wire)
        .err()
        .map(|e| e.to_string());
    match (old, new) {
        (Some(old), Some(new)) if old == new && new.contains("labels") => Ok(()),
        other => Err(format!(
            "expected the same refusal naming labels, got {other:?}"
        )),
    }
}

/// Every closed set a flag lists is one the API accepts, spelled as the API spells it.
#[test]
fn every_listed_value_of_a_flag_parses() -> Result<(), String> {
    use clap::CommandFactory;
    let mut failures = Vec::new();
    let mut checked = 0;
    fn walk(cmd: &clap::Command, path: &str, checked: &mut usize, failures: &mut Vec<String>) {
        for arg in cmd.get_arguments() {
            let values = arg.get_possible_values();
            if values.is_empty() {
                continue;
            }
            for v in values {
                let name = v.get_name();
                // The flag's own parser, alone in a command of its own.
                let alone = clap::Command::new("t").no_binary_name(true).arg(
                    clap::Arg::new("v")
                        .long("v")
                        .value_parser(arg.get_value_parser().clone()),
                );
                let parsed = alone.try_get_matches_from(["--v", name]);
                *checked += 1;
                if let Err(e) = parsed {
                    failures.push(format!("{path} --{}: {name}: {e}", arg.get_id()));
                }
            }
        }
        for sub in cmd.get_subcommands() {
            walk(
                sub,
                &format!("{path} {}", sub.get_name()),
                checked,
                failures,
            );
        }
    }
    walk(&Cli::command(), "bcctl", &mut checked, &mut failures);
    if checked < 20 {
        failures.push(format!("only {checked} listed values found"));
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n"))
    }
}
