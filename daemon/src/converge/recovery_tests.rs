//! The converge task after something was lost or failed: break-glass keys expire from what is
//! in `authorized_keys` when `spec.json` is gone or corrupt and no control plane answers, the
//! blocks of users the agent no longer remembers are still found, and a failed apply is retried
//! until it converges without a new spec.

use std::path::Path;
use std::time::Duration;

use std::sync::atomic::Ordering;
use tokio::sync::{mpsc, watch};

use bc_protocol::spec::GpuDriver;
use chrono::TimeZone;

use super::ssh::{BEGIN_MARKER, SshError};
use super::test_utils::{B, Rig, WAIT, key, next, spec};
use super::*;

/// Runs the task until `generation` with `spec` converged, then stops it.
async fn install(rig: &Rig, generation: u64, spec: pb::NodeSpec) {
    let (tx, rx) = watch::channel(None);
    let (stx, mut srx) = mpsc::channel(8);
    let task = rig.applier().spawn(rx, stx);
    let _ = tx.send(Some((generation, spec)));
    let st = next(&mut srx).await;
    assert!(st.converged, "{st:?}");
    drop(tx);
    let _ = task.await;
}

/// Waits until `f` holds, polling every 20 ms.
async fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !f() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn keys_expire_from_the_file_when_spec_json_is_lost_and_no_control_plane_answers()
-> Result<(), Box<dyn std::error::Error>> {
    for lose in ["delete", "corrupt", "delete both records"] {
        let rig = Rig::new()?;
        let t0 = rig.now.load(Ordering::SeqCst);
        let keys = vec![key("brief", Some(t0 + 200)), key("stays", None)];
        install(&rig, 1, spec(&[], "ops", keys)).await;
        let text = rig.keys_of("ops");
        assert!(
            text.contains("brief") && text.contains("expiry-time=\""),
            "{text}"
        );

        let spec_json = rig.state_dir().join(STATE_FILE);
        match lose {
            "corrupt" => std::fs::write(&spec_json, b"{\"observedGener")?,
            _ => std::fs::remove_file(&spec_json)?,
        }
        if lose == "delete both records" {
            std::fs::remove_file(rig.state_dir().join(managed::MANAGED_FILE))?;
        }
        // The agent restarts; the control plane never answers (nothing is ever sent).
        rig.now.store(t0 + 200, Ordering::SeqCst);
        let (_tx, rx) = watch::channel(None);
        let (stx, _srx) = mpsc::channel(8);
        let _task = rig.applier().spawn(rx, stx);
        until(&format!("{lose}: expired key removed"), || {
            !rig.keys_of("ops").contains("brief")
        })
        .await;
        let text = rig.keys_of("ops");
        assert!(
            text.contains("stays") && text.contains(BEGIN_MARKER),
            "{lose}: {text}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn the_old_users_block_is_removed_when_spec_json_is_lost()
-> Result<(), Box<dyn std::error::Error>> {
    for also_lose_the_user_record in [false, true] {
        let rig = Rig::new()?;
        install(&rig, 1, spec(&[], "ops", vec![key("k", None)])).await;
        assert!(rig.keys_of("ops").contains(BEGIN_MARKER));
        std::fs::remove_file(rig.state_dir().join(STATE_FILE))?;
        if also_lose_the_user_record {
            std::fs::remove_file(rig.state_dir().join(managed::MANAGED_FILE))?;
        }
        // The control plane now says: keys for `alt` only.
        install(&rig, 2, spec(&[], "alt", vec![key("k", None)])).await;
        assert!(
            !rig.keys_of("ops").contains(BEGIN_MARKER),
            "record lost too: {also_lose_the_user_record}: {}",
            rig.keys_of("ops")
        );
        assert!(rig.keys_of("alt").contains(BEGIN_MARKER));
    }
    Ok(())
}

#[test]
fn an_expiring_key_carries_sshds_expiry_time_and_the_agents_marker() -> Result<(), SshError> {
    let at = 1_800_000_000_123; // 2027-01-15T08:00:00.123Z
    let block = ssh_block::render_block(&[key("k", Some(at)), key("n", None)], 0)?;
    let lines: Vec<&str> = block.text.lines().collect();
    assert_eq!(lines[1], "# bcd-expires-at 2027-01-15T08:00:00.123Z");
    assert_eq!(
        lines[2],
        format!(
            "expiry-time=\"{}\" {} k",
            ssh_block::sshd_expiry_time(at),
            super::test_utils::KEY
        )
    );
    assert_eq!(lines[3], format!("{} n", super::test_utils::KEY));
    assert_eq!(block.installed, 2);
    assert_eq!(block.next_expiry_ms, Some(at));
    // sshd's time is local time to the second, rounded down.
    let local = chrono::Local
        .timestamp_opt(1_800_000_000, 0)
        .single()
        .map(|t| t.format("%Y%m%d%H%M%S").to_string());
    assert_eq!(Some(ssh_block::sshd_expiry_time(at)), local);
    // Read back from the file: the agent's expiry, to the millisecond.
    let keys = ssh_block::parse_block(block.text.as_bytes(), Path::new("f"))?.unwrap_or_default();
    let expiries: Vec<_> = keys.iter().map(|k| k.expires_at_ms).collect();
    assert_eq!(expiries, vec![Some(at), None]);
    // A marker that does not parse counts as expired.
    let bad = block.text.replace("2027-01-15T08:00:00.123Z", "soon");
    let keys = ssh_block::parse_block(bad.as_bytes(), Path::new("f"))?.unwrap_or_default();
    assert!(keys[0].expired_at(0));
    Ok(())
}

#[tokio::test]
async fn a_failed_apply_is_retried_until_it_converges_without_a_new_spec()
-> Result<(), Box<dyn std::error::Error>> {
    for case in ["state dir unwritable", "gpu busy", "user home missing"] {
        let rig = Rig::new()?;
        let blocker = rig.state_dir().join(STATE_FILE).join("blocker");
        let wire = match case {
            "state dir unwritable" => {
                // A full disk's stand-in: spec.json cannot be replaced (a non-empty directory
                // holds its name; mode bits would not stop root).
                std::fs::create_dir_all(&blocker)?;
                spec(&[], "ops", vec![key("k", None)])
            }
            "gpu busy" => {
                rig.probe.busy.lock().insert(B.to_owned(), vec![4711]);
                spec(&[(B, GpuDriver::VfioPci)], "", vec![])
            }
            _ => {
                std::fs::remove_dir_all(rig.tmp.path().join("root/home/ops"))?;
                spec(&[], "ops", vec![key("k", None)])
            }
        };
        let (tx, rx) = watch::channel(None);
        let (stx, mut srx) = mpsc::channel(64);
        let _task = rig
            .applier()
            .with_retry(Duration::from_millis(20), Duration::from_millis(200))
            .spawn(rx, stx);
        let _ = tx.send(Some((5, wire)));
        let first = next(&mut srx).await;
        assert_eq!((first.generation, first.converged), (5, false), "{case}");
        // The fault goes away; nothing new comes from the control plane.
        match case {
            "state dir unwritable" => std::fs::remove_dir_all(rig.state_dir().join(STATE_FILE))?,
            "gpu busy" => {
                rig.probe.busy.lock().clear();
            }
            _ => std::fs::create_dir_all(rig.tmp.path().join("root/home/ops"))?,
        }
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let st = next(&mut srx).await;
            assert_eq!(st.generation, 5, "{case}: {st:?}");
            if st.converged {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{case}: never converged"
            );
        }
        assert_eq!(observed_generation(&rig.state_dir()), 5, "{case}");
    }
    Ok(())
}

#[tokio::test]
async fn retries_while_nobody_reads_statuses_never_stop_key_expiry()
-> Result<(), Box<dyn std::error::Error>> {
    let rig = Rig::new()?;
    let t0 = rig.now.load(Ordering::SeqCst);
    // A GPU that stays busy: the apply fails and is retried again and again.
    rig.probe.busy.lock().insert(B.to_owned(), vec![4711]);
    let (tx, rx) = watch::channel(None);
    // The session is down: nobody reads the statuses (the agent's channel holds 16).
    let (stx, _srx) = mpsc::channel(16);
    let _task = rig
        .applier()
        .with_retry(Duration::from_millis(1), Duration::from_millis(2))
        .spawn(rx, stx);
    let _ = tx.send(Some((
        1,
        spec(
            &[(B, GpuDriver::VfioPci)],
            "ops",
            vec![key("brief", Some(t0 + 500))],
        ),
    )));
    until("the key installed", || rig.keys_of("ops").contains("brief")).await;
    // Far more retries than the channel holds.
    tokio::time::sleep(Duration::from_millis(300)).await;
    rig.now.store(t0 + 500, Ordering::SeqCst);
    until("the expired key removed while retries go on", || {
        !rig.keys_of("ops").contains("brief")
    })
    .await;
    Ok(())
}
