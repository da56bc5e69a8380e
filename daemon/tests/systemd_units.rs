//! `systemd-analyze verify` on the shipped units (`packaging/systemd/verify.sh`).
//! Without systemd-analyze the test says so loudly and passes, except under `CI=true`.

use std::path::Path;
use std::process::Command;

#[test]
fn units_pass_systemd_analyze_verify() {
    let script = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../packaging/systemd/verify.sh"
    ));
    let have = Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !have {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "systemd-analyze is missing on a CI machine"
        );
        eprintln!("!!! systemd-analyze not installed: unit files NOT verified");
        return;
    }
    let out = Command::new("sh").arg(script).output();
    let out = match out {
        Ok(o) => o,
        Err(e) => panic!("running {}: {e}", script.display()),
    };
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_broken_unit_is_caught() {
    // The check must be able to fail: the script rejects a unit with a misspelt value.
    let have = Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !have {
        eprintln!("!!! systemd-analyze not installed: skipped");
        return;
    }
    let dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => panic!("tempdir: {e}"),
    };
    let broken = include_str!("../../packaging/systemd/bcd.service")
        .replace("Restart=always", "Restart=alwayz");
    let wrote = std::fs::write(dir.path().join("bcd.service"), broken)
        .and_then(|()| {
            std::fs::write(
                dir.path().join("bcctl.service"),
                include_str!("../../packaging/systemd/bcctl.service"),
            )
        })
        .and_then(|()| {
            std::fs::write(
                dir.path().join("bcd-site.service"),
                include_str!("../../packaging/systemd/bcd-site.service"),
            )
        });
    if let Err(e) = wrote {
        panic!("write: {e}");
    }
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../packaging/systemd/verify.sh"
    );
    let out = match Command::new("sh")
        .arg(script)
        .env("UNIT_DIR", dir.path())
        .output()
    {
        Ok(o) => o,
        Err(e) => panic!("running {script}: {e}"),
    };
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("alwayz"), "{text}");
}

#[test]
fn the_site_unit_runs_bcd_site_with_its_own_state_dir_and_few_capabilities() {
    let unit = include_str!("../../packaging/systemd/bcd-site.service");
    for line in [
        "ExecStart=/usr/bin/bcd site --config /etc/bcd/bcd.toml",
        "Type=notify",
        "StateDirectory=bcd-site",
        "StateDirectoryMode=0700",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "CapabilityBoundingSet=CAP_SYSLOG CAP_NET_ADMIN",
        "UMask=0077",
    ] {
        assert!(
            unit.lines().any(|l| l == line),
            "bcd-site.service lacks {line:?}"
        );
    }
}
