//! The daemon side of the dependency rule (docs/architecture.md, "Crates"), read from
//! `cargo metadata`: a crate that gains a forbidden dependency fails here, not in review.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

/// Workspace crate -> the workspace crates it depends on (normal dependencies only: tests may
/// use more).
fn workspace_graph() -> BTreeMap<String, BTreeSet<String>> {
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("running cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let packages = meta["packages"].as_array().unwrap();
    let members: BTreeSet<String> = packages
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_owned())
        .collect();
    packages
        .iter()
        .map(|p| {
            let deps = p["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| d["kind"].is_null())
                .map(|d| d["name"].as_str().unwrap().to_owned())
                .filter(|d| members.contains(d))
                .collect();
            (p["name"].as_str().unwrap().to_owned(), deps)
        })
        .collect()
}

#[test]
fn daemon_crates_depend_only_downwards() {
    let graph = workspace_graph();
    // What each daemon-side crate may depend on inside the workspace; anything else is a layer
    // violation (a mode on the binary or on another mode, the core on hardware, the protocol on
    // anything).
    let allowed: &[(&str, &[&str])] = &[
        ("bc-protocol", &[]),
        ("bc-sys", &[]),
        ("bc-net", &[]),
        ("bcd-probes", &["bc-protocol"]),
        ("bcd-core", &["bc-protocol", "bc-sys"]),
        // bc-net: the boot service's bounded listener; bc-metal-sim: only with the test-utils
        // feature (the emulated BMCs of its test harness).
        (
            "bcd-site",
            &[
                "bc-protocol",
                "bc-net",
                "bcd-core",
                "bcd-probes",
                "bc-metal-sim",
            ],
        ),
        ("bc-metal-sim", &[]),
        ("bcd-ramdisk", &["bc-protocol", "bcd-core", "bcd-probes"]),
        (
            "bcd",
            &[
                "bc-protocol",
                "bc-sys",
                "bc-net",
                "bcd-probes",
                "bcd-core",
                "bcd-site",
                "bcd-ramdisk",
            ],
        ),
    ];
    for (krate, may) in allowed {
        let deps = graph
            .get(*krate)
            .unwrap_or_else(|| panic!("{krate} is not a workspace member"));
        let may: BTreeSet<String> = may.iter().map(|s| (*s).to_owned()).collect();
        let extra: Vec<&String> = deps.difference(&may).collect();
        assert!(extra.is_empty(), "{krate} must not depend on {extra:?}");
    }
    // Nothing depends on the binary crate, and nothing but the binary on a mode.
    for (krate, deps) in &graph {
        assert!(
            !deps.contains("bcd"),
            "{krate} depends on the bcd binary crate"
        );
        for mode in ["bcd-site", "bcd-ramdisk"] {
            assert!(
                krate == "bcd" || !deps.contains(mode),
                "{krate} depends on the mode {mode}"
            );
        }
    }
}
