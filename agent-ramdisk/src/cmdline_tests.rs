//! The kernel command line: required keys, duplicates, malformed values, the kernel's quoting.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

const PIN: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fn line(extra: &str) -> String {
    format!(
        "BOOT_IMAGE=vmlinuz console=ttyS0 panic=-1 bcd.url=https://10.0.2.2:7443 bcd.pin={PIN} bcd.token=abc.def bcd.node=node_1 {extra}"
    )
}

#[test]
fn the_boot_scripts_line_gives_every_setting() {
    let p = parse(&line(
        "bcd.log=debug bcd.modules=tg3,r8169 bcd.dhcp_timeout=90 bcd.lldp_wait=2\n",
    ))
    .unwrap();
    assert_eq!(p.urls, ["https://10.0.2.2:7443"]);
    assert_eq!(p.pin, PIN);
    assert_eq!(p.token, "abc.def");
    assert_eq!(p.node.as_deref(), Some("node_1"));
    assert_eq!(p.log.as_deref(), Some("debug"));
    assert_eq!(p.modules, ["tg3", "r8169"]);
    assert_eq!(p.dhcp_timeout, Some(Duration::from_secs(90)));
    assert_eq!(p.lldp_wait, Duration::from_secs(2));
    assert!(p.unknown.is_empty());
    assert!(
        !format!("{p:?}").contains("abc.def"),
        "Debug shows the token"
    );
}

#[test]
fn optional_settings_default_to_none() {
    let p = parse(&format!(
        "bcd.url=https://cp:7443 bcd.token=t bcd.pin={PIN}"
    ))
    .unwrap();
    assert_eq!((p.node, p.log, p.dhcp_timeout), (None, None, None));
    assert!(p.modules.is_empty());
    assert_eq!(p.lldp_wait, DEFAULT_LLDP_WAIT);
    assert_eq!(DEFAULT_LLDP_WAIT, Duration::from_secs(30));
}

#[test]
fn each_required_key_is_named_when_missing() {
    for key in ["bcd.url", "bcd.pin", "bcd.token"] {
        let text: String = line("")
            .split(' ')
            .filter(|w| !w.starts_with(&format!("{key}=")))
            .collect::<Vec<_>>()
            .join(" ");
        assert_eq!(parse(&text), Err(CmdlineError::Missing(key)), "{text}");
    }
    // A key without a value is as good as none.
    let text = line("").replace("bcd.token=abc.def", "bcd.token");
    assert_eq!(parse(&text), Err(CmdlineError::Missing("bcd.token")));
    let text = line("").replace("bcd.token=abc.def", "bcd.token=");
    assert_eq!(parse(&text), Err(CmdlineError::Missing("bcd.token")));
}

#[test]
fn a_key_given_twice_is_refused() {
    let err = parse(&line("bcd.token=other")).unwrap_err();
    assert_eq!(err, CmdlineError::Duplicate("bcd.token".into()));
    assert!(err.to_string().contains("bcd.token twice"), "{err}");
}

#[test]
fn a_malformed_pin_is_refused_with_what_was_expected() {
    for bad in [
        "sha256:xyz",
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        "sha1:0123456789abcdef0123456789abcdef01234567",
        &PIN[..PIN.len() - 2],
    ] {
        let err = parse(&line("").replace(PIN, bad)).unwrap_err();
        assert!(
            matches!(&err, CmdlineError::Malformed { key: "bcd.pin", value, .. } if value == bad),
            "{bad}: {err:?}"
        );
        assert!(err.to_string().contains("sha256:<64 hex digits>"), "{err}");
    }
}

#[test]
fn the_url_must_be_https() {
    for bad in [
        "http://10.0.2.2:7443",
        "10.0.2.2:7443",
        "https://",
        "https://h/p",
    ] {
        let err = parse(&line("").replace("https://10.0.2.2:7443", bad)).unwrap_err();
        assert!(
            matches!(err, CmdlineError::Malformed { key: "bcd.url", .. }),
            "{bad}: {err:?}"
        );
    }
}

#[test]
fn bcd_url_may_list_every_replica() {
    let two = "https://10.0.2.2:7443,https://10.0.2.3:7443";
    let p = parse(&line("").replace("https://10.0.2.2:7443", two)).unwrap();
    assert_eq!(p.urls, ["https://10.0.2.2:7443", "https://10.0.2.3:7443"]);
    let err = parse(&line("").replace("https://10.0.2.2:7443", "https://a:1,http://b:2"));
    assert_eq!(
        err.err(),
        Some(CmdlineError::Malformed {
            key: "bcd.url",
            value: "http://b:2".to_owned(),
            why: "expected https://host:port of the control plane's gateway",
        })
    );
    let err = parse(&line("").replace("https://10.0.2.2:7443", ","));
    assert_eq!(err.err(), Some(CmdlineError::Missing("bcd.url")));
}

#[test]
fn quoted_values_follow_the_kernels_rules() {
    let w = words(r#"a="x y" "b=c d" e f= g="h" "i" --"#);
    let expect: Vec<(String, Option<String>)> = vec![
        ("a".into(), Some("x y".into())),
        ("b".into(), Some("c d".into())),
        ("e".into(), None),
        ("f".into(), Some(String::new())),
        ("g".into(), Some("h".into())),
        ("i".into(), None),
    ];
    assert_eq!(w, expect);
    let p = parse(&line(r#"bcd.log="info,bcd=debug""#)).unwrap();
    assert_eq!(p.log.as_deref(), Some("info,bcd=debug"));
    let p = parse(&line("").replace("bcd.node=node_1", r#""bcd.node=rack 4 slot 2""#)).unwrap();
    assert_eq!(p.node.as_deref(), Some("rack 4 slot 2"));
}

#[test]
fn an_unterminated_quote_runs_to_the_end_like_the_kernels() {
    let w = words(r#"a=1 b="x y"#);
    assert_eq!(w[1], ("b".into(), Some("x y".into())));
}

#[test]
fn what_follows_a_double_dash_is_inits() {
    let text = format!("bcd.url=https://cp:1 bcd.pin={PIN} -- bcd.token=t");
    assert_eq!(parse(&text), Err(CmdlineError::Missing("bcd.token")));
}

#[test]
fn unknown_bcd_keys_are_reported_not_refused() {
    let p = parse(&line("bcd.future=1 bcdx=2")).unwrap();
    assert_eq!(p.unknown, ["bcd.future"]);
}

#[test]
fn modules_and_dhcp_timeout_are_checked() {
    let err = parse(&line("bcd.modules=ok,bad/name")).unwrap_err();
    assert!(matches!(
        err,
        CmdlineError::Malformed {
            key: "bcd.modules",
            ..
        }
    ));
    for bad in ["0", "-1", "abc", "99999"] {
        let err = parse(&line(&format!("bcd.dhcp_timeout={bad}"))).unwrap_err();
        assert!(
            matches!(
                err,
                CmdlineError::Malformed {
                    key: "bcd.dhcp_timeout",
                    ..
                }
            ),
            "{bad}"
        );
    }
}

#[test]
fn lldp_wait_is_whole_seconds_up_to_ten_minutes() {
    let p = parse(&line("bcd.lldp_wait=0")).unwrap();
    assert_eq!(p.lldp_wait, Duration::ZERO, "0: no wait");
    let p = parse(&line("bcd.lldp_wait=600")).unwrap();
    assert_eq!(p.lldp_wait, Duration::from_secs(600));
    for bad in ["-1", "1.5", "abc", "601"] {
        let err = parse(&line(&format!("bcd.lldp_wait={bad}"))).unwrap_err();
        assert_eq!(
            err,
            CmdlineError::Malformed {
                key: "bcd.lldp_wait",
                value: bad.to_owned(),
                why: "expected whole seconds from 0 to 600",
            }
        );
    }
}

#[test]
fn a_token_with_a_quote_is_refused_without_showing_it() {
    let err = parse(&line("").replace("bcd.token=abc.def", r#"bcd.token="se"cret""#)).unwrap_err();
    assert!(!err.to_string().contains("cret"), "{err}");
}

#[test]
fn bootif_names_the_boot_nic_and_a_malformed_one_does_not_stop_the_boot() {
    let p = parse(&format!("{} BOOTIF=01-52-54-00-12-34-56", line(""))).unwrap();
    assert_eq!(p.boot_mac.as_deref(), Some("52:54:00:12:34:56"));
    assert_eq!(p.boot_if_ignored, None);
    // pxelinux appends its own after the configured one's: the last counts.
    let p = parse(&format!(
        "BOOTIF=01-aa-aa-aa-aa-aa-aa {} BOOTIF=01-52-54-00-12-34-57",
        line("")
    ))
    .unwrap();
    assert_eq!(p.boot_mac.as_deref(), Some("52:54:00:12:34:57"));
    let p = parse(&format!("{} BOOTIF=52:54:00:12:34:56", line(""))).unwrap();
    assert_eq!(p.boot_mac, None);
    assert!(
        p.boot_if_ignored
            .as_deref()
            .is_some_and(|w| w.starts_with("BOOTIF=\"52:54:00:12:34:56\": hardware type 52")),
        "{p:?}"
    );
    assert_eq!(parse(&line("")).unwrap().boot_mac, None);
}
