//! The crate graph enforces the control plane's layers (docs/architecture.md): read from
//! `cargo metadata`, no workspace crate but `cpl-store` depends on rusqlite or
//! rusqlite_migration, and `cpl-core` does not reach axum, tonic, hyper or http through its
//! normal dependencies, directly or transitively, with the features it asks for.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::process::Command;

use serde_json::Value;

/// Crates only the store may depend on.
const SQL_CRATES: &[&str] = &["rusqlite", "rusqlite_migration", "tokio-postgres", "r2d2"];
/// The one crate that may.
const STORE: &str = "cpl-store";
/// The core crate and the transport crates it must not reach.
const CORE: &str = "cpl-core";
const TRANSPORT_CRATES: &[&str] = &["axum", "tonic", "hyper", "http"];

fn metadata() -> Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--manifest-path"])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml"))
        .output()
        .expect("running cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON")
}

/// The graph as `cargo metadata` gives it: packages by id, and each package's resolved
/// dependency ids by package name.
struct Graph<'a> {
    packages: BTreeMap<&'a str, &'a Value>,
    resolved: BTreeMap<&'a str, BTreeMap<&'a str, &'a str>>,
    members: Vec<&'a str>,
}

impl<'a> Graph<'a> {
    fn new(meta: &'a Value) -> Self {
        let packages: BTreeMap<&str, &Value> = meta["packages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p["id"].as_str().unwrap(), p))
            .collect();
        let mut resolved = BTreeMap::new();
        for node in meta["resolve"]["nodes"].as_array().unwrap() {
            let deps = node["deps"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| {
                    let pkg = d["pkg"].as_str().unwrap();
                    (packages[pkg]["name"].as_str().unwrap(), pkg)
                })
                .collect();
            resolved.insert(node["id"].as_str().unwrap(), deps);
        }
        let members = meta["workspace_members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m.as_str().unwrap())
            .collect();
        Graph {
            packages,
            resolved,
            members,
        }
    }

    fn name(&self, id: &str) -> &'a str {
        self.packages[id]["name"].as_str().unwrap()
    }

    fn id_of(&self, name: &str) -> &'a str {
        self.members
            .iter()
            .copied()
            .find(|id| self.name(id) == name)
            .unwrap_or_else(|| panic!("{name} is not a workspace member"))
    }

    /// Normal (non-dev, non-build) dependencies `id` declares.
    fn normal_deps(&self, id: &str) -> impl Iterator<Item = &'a Value> {
        self.packages[id]["dependencies"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| d["kind"].is_null())
    }

    /// The features of `id` that `requested` turns on, and what they ask of its dependencies:
    /// (optional dependencies switched on, features asked of each dependency).
    fn expand(
        &self,
        id: &str,
        requested: &BTreeSet<String>,
    ) -> (BTreeSet<String>, BTreeMap<String, BTreeSet<String>>) {
        let table = &self.packages[id]["features"];
        let mut on_deps = BTreeSet::new();
        let mut dep_features: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut seen = BTreeSet::new();
        let mut queue: VecDeque<String> = requested.iter().cloned().collect();
        while let Some(f) = queue.pop_front() {
            if !seen.insert(f.clone()) {
                continue;
            }
            let Some(values) = table.get(&f).and_then(Value::as_array) else {
                // An optional dependency used as an implicit feature.
                on_deps.insert(f);
                continue;
            };
            for v in values.iter().filter_map(Value::as_str) {
                if let Some(dep) = v.strip_prefix("dep:") {
                    on_deps.insert(dep.to_owned());
                } else if let Some((dep, feat)) = v.split_once('/') {
                    let (dep, weak) = match dep.strip_suffix('?') {
                        Some(d) => (d, true),
                        None => (dep, false),
                    };
                    if !weak {
                        on_deps.insert(dep.to_owned());
                    }
                    dep_features
                        .entry(dep.to_owned())
                        .or_default()
                        .insert(feat.to_owned());
                } else {
                    queue.push_back(v.to_owned());
                }
            }
        }
        (on_deps, dep_features)
    }

    /// Every package `root` reaches through normal dependencies, with the features each asks of
    /// the next.
    fn reach(&self, root: &'a str) -> BTreeSet<&'a str> {
        let mut out = BTreeSet::new();
        let mut visited: BTreeSet<(String, BTreeSet<String>)> = BTreeSet::new();
        let start: BTreeSet<String> = ["default".to_owned()].into();
        let mut queue = VecDeque::from([(root, start)]);
        while let Some((id, features)) = queue.pop_front() {
            if !visited.insert((id.to_owned(), features.clone())) {
                continue;
            }
            out.insert(self.name(id));
            let (on_deps, mut dep_features) = self.expand(id, &features);
            for d in self.normal_deps(id) {
                let name = d["name"].as_str().unwrap();
                let key = d["rename"].as_str().unwrap_or(name);
                if d["optional"].as_bool().unwrap_or(false) && !on_deps.contains(key) {
                    continue;
                }
                // Not resolved at all (another platform's dependency): not in the graph.
                let Some(&dep_id) = self.resolved.get(id).and_then(|r| r.get(name)) else {
                    continue;
                };
                let mut asked: BTreeSet<String> = d["features"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter_map(|f| f.as_str().map(str::to_owned))
                    .collect();
                if d["uses_default_features"].as_bool().unwrap_or(true) {
                    asked.insert("default".to_owned());
                }
                asked.extend(dep_features.remove(key).unwrap_or_default());
                queue.push_back((dep_id, asked));
            }
        }
        out
    }
}

#[test]
fn only_the_store_depends_on_sqlite() {
    let meta = metadata();
    let g = Graph::new(&meta);
    let mut offenders = Vec::new();
    for &id in &g.members {
        let name = g.name(id);
        if name == STORE {
            continue;
        }
        for d in g.normal_deps(id) {
            let dep = d["name"].as_str().unwrap();
            if SQL_CRATES.contains(&dep) {
                offenders.push(format!("{name} -> {dep}"));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "only {STORE} may depend on {SQL_CRATES:?}; found {offenders:?}"
    );
    let store = g.id_of(STORE);
    assert!(
        g.normal_deps(store)
            .any(|d| d["name"].as_str() == Some("rusqlite")),
        "{STORE} is where SQLite lives"
    );
}

#[test]
fn the_core_reaches_no_transport() {
    let meta = metadata();
    let g = Graph::new(&meta);
    let reached = g.reach(g.id_of(CORE));
    assert!(reached.contains("cpl-store") && reached.contains("bc-protocol"));
    let bad: Vec<&&str> = TRANSPORT_CRATES
        .iter()
        .filter(|c| reached.contains(**c))
        .collect();
    assert!(
        bad.is_empty(),
        "{CORE} must not depend on {bad:?} (directly or through its normal dependencies); it reaches {reached:?}"
    );
    assert!(
        !SQL_CRATES.iter().any(|c| g
            .normal_deps(g.id_of(CORE))
            .any(|d| d["name"].as_str() == Some(c))),
        "{CORE} must not depend on SQL crates itself"
    );
}

#[test]
fn the_walk_sees_the_transport_the_adapters_use() {
    // The same walk from controlplane-lite must find tonic and axum: a walk that found nothing
    // anywhere would pass the test above for the wrong reason.
    let meta = metadata();
    let g = Graph::new(&meta);
    let reached = g.reach(g.id_of("controlplane-lite"));
    for c in TRANSPORT_CRATES {
        assert!(reached.contains(c), "controlplane-lite should reach {c}");
    }
    assert!(reached.contains("rusqlite"));
}
