//! The shipped Grafana dashboards (`packaging/grafana/*.json`) and Prometheus alert rules
//! (`packaging/prometheus/*.yml`) against the binaries: every metric their PromQL names is one a
//! real `bcctl serve` or `bcd agent` exports (scraped from the processes, so a renamed or
//! dropped metric fails here, not on an operator's empty panel); every alert carries a severity,
//! a summary and a runbook; `promtool check rules` accepts the rules and `promtool test rules`
//! passes their cases (`packaging/prometheus/tests/`).
//!
//! promtool comes from Debian's `prometheus` package (`BC_PROMTOOL`, else on PATH; scripts/test
//! unpacks it into target/promtool). Without it that test says so loudly and skips, and fails
//! under `CI=true`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use bc_e2e::{Agent, ControlPlane, eventually};
use promql_parser::parser::{Expr, parse};
use promql_parser::util::{ExprVisitor, walk_expr};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(30);

/// Series Prometheus makes itself for every target; the binaries do not export them.
const MADE_BY_PROMETHEUS: &[&str] = &["up"];

fn packaging() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../packaging")).to_owned()
}

fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .collect();
    out.sort();
    assert!(!out.is_empty(), "no *.{ext} in {}", dir.display());
    out
}

struct Names(BTreeSet<String>);

impl ExprVisitor for Names {
    type Error = String;
    fn pre_visit(&mut self, e: &Expr) -> Result<bool, String> {
        let vs = match e {
            Expr::VectorSelector(vs) => vs,
            Expr::MatrixSelector(ms) => &ms.vs,
            _ => return Ok(true),
        };
        match &vs.name {
            Some(n) => {
                self.0.insert(n.clone());
                Ok(true)
            }
            None => Err(format!("a selector without a metric name: {vs}")),
        }
    }
}

/// The metric names `expr` selects. Grafana's `$__rate_interval` reads as `5m`; other `$vars`
/// only appear inside label matchers' strings, which PromQL takes as they are.
fn metric_names(expr: &str) -> Result<BTreeSet<String>, String> {
    let promql = expr
        .replace("$__rate_interval", "5m")
        .replace("$__interval", "1m");
    let ast = parse(&promql).map_err(|e| format!("{expr}: {e}"))?;
    let mut names = Names(BTreeSet::new());
    walk_expr(&mut names, &ast)?;
    Ok(names.0)
}

/// Every PromQL expression of a dashboard: panels' (and rows' panels') `targets[].expr`, and
/// the metric of each `label_values(METRIC, LABEL)` variable query.
fn dashboard_exprs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("expr", Value::String(e)) => out.push(e.clone()),
                    ("definition", Value::String(d)) => {
                        if let Some(rest) = d.strip_prefix("label_values(") {
                            let metric = rest.split([',', ')']).next().unwrap_or("").trim();
                            out.push(metric.to_owned());
                        }
                    }
                    _ => dashboard_exprs(x, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| dashboard_exprs(x, out)),
        _ => {}
    }
}

/// `(alert name, expr, labels, annotations)` of every rule of a rules file.
type Rule = (
    String,
    String,
    BTreeMap<String, String>,
    BTreeMap<String, String>,
);

fn rules(path: &Path) -> Vec<Rule> {
    #[derive(serde::Deserialize)]
    struct File {
        groups: Vec<Group>,
    }
    #[derive(serde::Deserialize)]
    struct Group {
        rules: Vec<RuleDoc>,
    }
    #[derive(serde::Deserialize)]
    struct RuleDoc {
        alert: Option<String>,
        record: Option<String>,
        expr: String,
        #[serde(default)]
        labels: BTreeMap<String, String>,
        #[serde(default)]
        annotations: BTreeMap<String, String>,
    }
    let text = std::fs::read_to_string(path).unwrap();
    let f: File =
        serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    f.groups
        .into_iter()
        .flat_map(|g| g.rules)
        .map(|r| {
            (
                r.alert.or(r.record).unwrap_or_default(),
                r.expr,
                r.labels,
                r.annotations,
            )
        })
        .collect()
}

/// Every sample name an OpenMetrics exposition can carry, from its `# TYPE` lines (so a family
/// with no series yet, such as XIDs before the first one, counts) and its samples.
fn exported(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for l in text.lines() {
        if let Some(rest) = l.strip_prefix("# TYPE ") {
            let mut w = rest.split_whitespace();
            let (Some(name), Some(kind)) = (w.next(), w.next()) else {
                continue;
            };
            let suffixes: &[&str] = match kind {
                "counter" => &["_total", "_created"],
                "histogram" => &["_bucket", "_sum", "_count", "_created"],
                "summary" => &["", "_sum", "_count", "_created"],
                "info" => &["_info"],
                _ => &[""],
            };
            out.extend(suffixes.iter().map(|s| format!("{name}{s}")));
        } else if !l.starts_with('#')
            && let Some(name) = l.split(['{', ' ']).next().filter(|n| !n.is_empty())
        {
            out.insert(name.to_owned());
        }
    }
    out
}

fn scrape(url: &str) -> String {
    let resp = reqwest::blocking::get(url).expect("metrics endpoint reachable");
    assert_eq!(resp.status().as_u16(), 200, "{url}");
    resp.text().unwrap()
}

fn read_json(path: &Path) -> Option<Value> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

/// `name -> where it is used`, over every dashboard and rules file.
fn used_metrics() -> BTreeMap<String, BTreeSet<String>> {
    let mut used: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut note = |expr: &str, place: String| {
        let names = metric_names(expr).unwrap_or_else(|e| panic!("{place}: {e}"));
        assert!(!names.is_empty(), "{place}: {expr} names no metric");
        for n in names {
            used.entry(n).or_default().insert(place.clone());
        }
    };
    for f in files(&packaging().join("grafana"), "json") {
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&f).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let mut exprs = Vec::new();
        dashboard_exprs(&v, &mut exprs);
        assert!(exprs.len() >= 5, "{}: {} queries", f.display(), exprs.len());
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        for e in exprs {
            note(&e, name.clone());
        }
    }
    for f in files(&packaging().join("prometheus"), "yml") {
        let file = f.file_name().unwrap().to_string_lossy().into_owned();
        for (alert, expr, _, _) in rules(&f) {
            note(&expr, format!("{file}: {alert}"));
        }
    }
    used
}

#[test]
fn the_metric_names_of_an_expression_are_found() {
    let got = metric_names(
        "histogram_quantile(0.99, sum by (le) (rate(a_seconds_bucket{x=~\"$instance\"}[$__rate_interval]))) \
         > 1 and on() (max(b) - count(c_total offset 5m) > bool 3) or vector(0)",
    )
    .unwrap();
    assert_eq!(
        got.into_iter().collect::<Vec<_>>(),
        ["a_seconds_bucket", "b", "c_total"]
    );
    assert!(metric_names("rate(a_total[5m]").is_err());
    assert!(metric_names("{job=\"bcd\"}").is_err());
    // A histogram family exports its three sample names; a counter its _total.
    let text = "# TYPE h histogram\n# TYPE c counter\nc_total 1\n# TYPE g gauge\n# EOF\n";
    let e = exported(text);
    for n in ["h_bucket", "h_sum", "h_count", "c_total", "g"] {
        assert!(e.contains(n), "{n}: {e:?}");
    }
    assert!(!e.contains("h") && !e.contains("c"), "{e:?}");
}

#[test]
fn every_metric_the_dashboards_and_rules_name_is_exported_by_bcctl_serve_or_bcd_agent() {
    let used = used_metrics();
    // The dashboards cover sessions, joins, heartbeats, the store, the controllers, bare metal,
    // GPUs, XIDs and commands: far more than a handful of names.
    assert!(
        used.len() >= 30,
        "only {} metrics used: {used:?}",
        used.len()
    );

    let tmp = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start_with(&tmp.path().join("cp"), &["--metrics-listen", "127.0.0.1:0"]);
    let cp_url = read_json(&cp.dir.join("endpoints.json")).unwrap()["metricsUrl"]
        .as_str()
        .expect("endpoints.json has metricsUrl")
        .to_owned();
    let pool = cp.metal_host_pool();
    let token = cp.create_token(&["--pool", &pool]);
    let agent = Agent::start(
        &cp,
        &tmp.path().join("agent"),
        Some(&token),
        &["--metrics-listen", "127.0.0.1:0"],
    );
    let agent_url = eventually(WAIT, "status.json metricsUrl", || {
        read_json(&agent.state_dir.join("status.json"))?["metricsUrl"]
            .as_str()
            .map(str::to_owned)
    });
    let mut have = exported(&scrape(&cp_url));
    have.extend(exported(&scrape(&agent_url)));
    have.extend(MADE_BY_PROMETHEUS.iter().map(|s| (*s).to_owned()));

    let missing: Vec<String> = used
        .iter()
        .filter(|(n, _)| !have.contains(*n))
        .map(|(n, places)| format!("{n} (used in {places:?})"))
        .collect();
    assert!(
        missing.is_empty(),
        "named by dashboards or rules but exported by neither binary:\n{}\nexported: {have:?}",
        missing.join("\n")
    );
}

#[test]
fn every_alert_has_a_severity_a_summary_and_a_runbook() {
    let mut alerts = BTreeSet::new();
    for f in files(&packaging().join("prometheus"), "yml") {
        for (alert, _, labels, annotations) in rules(&f) {
            assert!(
                matches!(
                    labels.get("severity").map(String::as_str),
                    Some("critical" | "warning" | "info")
                ),
                "{alert}: severity {labels:?}"
            );
            for key in ["summary", "description"] {
                assert!(
                    annotations.get(key).is_some_and(|s| !s.trim().is_empty()),
                    "{alert}: no {key}"
                );
            }
            let runbook = annotations.get("runbook").map_or("", String::as_str);
            assert!(
                runbook.lines().count() >= 3,
                "{alert}: a runbook says what happened and what to do: {runbook:?}"
            );
            assert!(alerts.insert(alert.clone()), "{alert} twice");
        }
    }
    for want in [
        "BcNodesUnreachable",
        "BcControllerLeaseFlapping",
        "BcBmcUnreachable",
        "BcRamdiskBootFailed",
        "BcWorkflowStuck",
        "BcGpuUnhealthy",
    ] {
        assert!(alerts.contains(want), "no alert {want}: {alerts:?}");
    }
}

/// promtool from `BC_PROMTOOL`, else on PATH; `None` (said loudly) when neither, which fails
/// under `CI=true`.
fn promtool() -> Option<PathBuf> {
    let found = std::env::var_os("BC_PROMTOOL")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::split_paths(&std::env::var_os("PATH")?)
                .map(|d| d.join("promtool"))
                .find(|p| p.is_file())
        });
    if found.is_none() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "promtool is missing (Debian package prometheus; scripts/test unpacks it into target/promtool)"
        );
        eprintln!(
            "!!! promtool: SKIPPED, promtool is missing (Debian package prometheus; scripts/test unpacks it)"
        );
    }
    found
}

fn run(cmd: &mut Command) -> (bool, String) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn promtool_checks_the_rules_and_passes_their_cases() {
    let Some(promtool) = promtool() else {
        return;
    };
    let dir = packaging().join("prometheus");
    let rule_files = files(&dir, "yml");
    let (ok, out) = run(Command::new(&promtool)
        .args(["check", "rules"])
        .args(&rule_files));
    assert!(ok, "promtool check rules:\n{out}");

    // The check can fail: a rule with broken PromQL is refused.
    let tmp = tempfile::tempdir().unwrap();
    let broken =
        std::fs::read_to_string(&rule_files[0])
            .unwrap()
            .replacen("expr: ", "expr: rate(", 1);
    std::fs::write(tmp.path().join("broken.yml"), broken).unwrap();
    let (ok, out) = run(Command::new(&promtool)
        .args(["check", "rules"])
        .arg(tmp.path().join("broken.yml")));
    assert!(!ok, "a broken rule passed promtool check rules:\n{out}");

    // The cases run against the rules without their annotations (promtool compares annotations
    // whole; the cases are about when alerts fire and with which labels).
    for f in &rule_files {
        let mut doc: serde_norway::Value =
            serde_norway::from_str(&std::fs::read_to_string(f).unwrap()).unwrap();
        for g in doc["groups"].as_sequence_mut().unwrap() {
            for r in g["rules"].as_sequence_mut().unwrap() {
                r.as_mapping_mut().unwrap().remove("annotations");
            }
        }
        std::fs::write(
            tmp.path().join(f.file_name().unwrap()),
            serde_norway::to_string(&doc).unwrap(),
        )
        .unwrap();
    }
    let cases = files(&dir.join("tests"), "yml");
    for c in &cases {
        std::fs::copy(c, tmp.path().join(c.file_name().unwrap())).unwrap();
    }
    let (ok, out) = run(Command::new(&promtool)
        .args(["test", "rules"])
        .args(cases.iter().map(|c| c.file_name().unwrap()))
        .current_dir(tmp.path()));
    assert!(ok, "promtool test rules:\n{out}");
    assert!(out.contains("SUCCESS"), "{out}");
}
