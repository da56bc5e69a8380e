use std::path::PathBuf;
use std::time::Duration;

use std::sync::atomic::Ordering;
use tokio::sync::{mpsc, watch};

use bc_protocol::spec::GpuDriver;

use super::test_utils::{A, B, Rig, WAIT, key, next, spec};
use super::*;

#[tokio::test]
async fn converges_reports_and_a_second_apply_writes_nothing() -> Result<(), ConvergeError> {
    let rig = Rig::new().map_err(|source| ConvergeError::Io {
        op: "setup",
        path: PathBuf::new(),
        source,
    })?;
    let (tx, rx) = watch::channel(None);
    let (stx, mut srx) = mpsc::channel(8);
    let task = rig.applier().spawn(rx, stx);
    let s1 = spec(&[(A, GpuDriver::VfioPci)], "ops", vec![key("oncall", None)]);
    let _ = tx.send(Some((1, s1.clone())));
    let st = next(&mut srx).await;
    assert_eq!(
        (st.generation, st.converged, st.reason.as_str()),
        (1, true, "Converged")
    );
    assert_eq!(rig.bus.driver(A).as_deref(), Some("vfio-pci"));
    assert!(rig.keys_of("ops").contains("oncall"));
    assert_eq!(observed_generation(&rig.state_dir()), 1);

    rig.bus.writes.lock().clear();
    let before = rig.keys_of("ops");
    let _ = tx.send(Some((2, s1)));
    let st = next(&mut srx).await;
    assert_eq!((st.generation, st.converged), (2, true));
    assert!(rig.bus.writes.lock().is_empty(), "same spec rewrote sysfs");
    assert_eq!(rig.keys_of("ops"), before);
    assert_eq!(observed_generation(&rig.state_dir()), 2);
    drop(tx);
    let _ = task.await;
    Ok(())
}

#[tokio::test]
async fn failure_reports_reason_and_keeps_observed_generation()
-> Result<(), Box<dyn std::error::Error>> {
    let rig = Rig::new()?;
    let (tx, rx) = watch::channel(None);
    let (stx, mut srx) = mpsc::channel(8);
    let _task = rig.applier().spawn(rx, stx);
    let _ = tx.send(Some((1, spec(&[(A, GpuDriver::Nvidia)], "", vec![]))));
    assert!(next(&mut srx).await.converged);

    rig.probe.busy.lock().insert(B.to_owned(), vec![777]);
    let _ = tx.send(Some((
        2,
        spec(
            &[(B, GpuDriver::VfioPci)],
            "ops",
            vec![key("during-outage", None)],
        ),
    )));
    let st = next(&mut srx).await;
    assert_eq!((st.generation, st.converged), (2, false));
    assert_eq!(st.reason, "GpuBusy");
    assert!(st.message.contains("777"), "{}", st.message);
    assert_eq!(rig.bus.driver(B).as_deref(), Some("nvidia"));
    assert_eq!(observed_generation(&rig.state_dir()), 1);
    // The SSH section converged anyway: it is how an operator gets in to fix the GPU.
    assert!(rig.keys_of("ops").contains("during-outage"));
    Ok(())
}

#[tokio::test]
async fn a_newer_generation_supersedes_an_apply_in_flight() -> Result<(), Box<dyn std::error::Error>>
{
    let rig = Rig::new()?;
    // Hold generation 1 inside its first rebind until generation 2 has been sent.
    let (entered_tx, entered_rx) = std::sync::mpsc::sync_channel::<()>(1);
    let (go_tx, go_rx) = std::sync::mpsc::sync_channel::<()>(1);
    let go_rx = parking_lot::Mutex::new(go_rx);
    *rig.bus.hook.lock() = Some(Box::new(move |addr| {
        if addr == A {
            let _ = entered_tx.try_send(());
            let _ = go_rx.lock().recv_timeout(WAIT);
        }
    }));
    let (tx, rx) = watch::channel(None);
    let (stx, mut srx) = mpsc::channel(8);
    let _task = rig.applier().spawn(rx, stx);
    let gen1 = spec(
        &[(A, GpuDriver::VfioPci), (B, GpuDriver::VfioPci)],
        "ops",
        vec![key("gen1", None)],
    );
    let _ = tx.send(Some((1, gen1)));
    tokio::task::spawn_blocking(move || entered_rx.recv_timeout(WAIT)).await??;
    let _ = tx.send(Some((2, spec(&[], "ops", vec![key("gen2", None)]))));
    go_tx.send(())?;

    let st = next(&mut srx).await;
    assert_eq!((st.generation, st.converged), (2, true), "{st:?}");
    // Generation 1 stopped after the GPU it was inside: B and its keys were never applied.
    assert!(
        rig.bus.writes_for(B).is_empty(),
        "{:?}",
        rig.bus.writes.lock()
    );
    let keys = rig.keys_of("ops");
    assert!(keys.contains("gen2") && !keys.contains("gen1"), "{keys}");
    assert_eq!(observed_generation(&rig.state_dir()), 2);
    assert!(
        tokio::time::timeout(Duration::from_millis(200), srx.recv())
            .await
            .is_err(),
        "a status was reported for the superseded generation"
    );
    Ok(())
}

#[tokio::test]
async fn keys_expire_without_any_message_from_the_control_plane()
-> Result<(), Box<dyn std::error::Error>> {
    let rig = Rig::new()?;
    let t0 = rig.now.load(Ordering::SeqCst);
    let (tx, rx) = watch::channel(None);
    let (stx, mut srx) = mpsc::channel(8);
    let _task = rig.applier().spawn(rx, stx);
    let _ = tx.send(Some((
        1,
        spec(
            &[],
            "ops",
            vec![key("brief", Some(t0 + 200)), key("stays", None)],
        ),
    )));
    assert!(next(&mut srx).await.converged);
    assert!(rig.keys_of("ops").contains("brief"));

    // Time passes; nothing else is sent (the session may be down).
    rig.now.store(t0 + 200, Ordering::SeqCst);
    let deadline = tokio::time::Instant::now() + WAIT;
    let pruned = |s: &AppliedState| s.ssh_applied.as_ref().map(|b| b.keys.len()) == Some(1);
    while rig.keys_of("ops").contains("brief")
        || !AppliedState::load(&rig.state_dir()).is_ok_and(|s| pruned(&s))
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "expired key still installed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(rig.keys_of("ops").contains("stays"));
    assert_eq!(AppliedState::load(&rig.state_dir())?.observed_generation, 1);
    Ok(())
}

#[tokio::test]
async fn restart_reapplies_the_last_spec_before_any_contact()
-> Result<(), Box<dyn std::error::Error>> {
    let rig = Rig::new()?;
    let (tx, rx) = watch::channel(None);
    let (stx, mut srx) = mpsc::channel(8);
    let task = rig.applier().spawn(rx, stx);
    let _ = tx.send(Some((3, spec(&[(A, GpuDriver::VfioPci)], "", vec![]))));
    assert!(next(&mut srx).await.converged);
    drop(tx);
    task.await?;

    // Reboot: driver_override is gone and the GPU is back on nvidia.
    rig.bus
        .devs
        .lock()
        .insert(A.to_owned(), (Some("nvidia".to_owned()), None));
    let (_tx, rx) = watch::channel(None);
    let (stx, mut srx) = mpsc::channel(8);
    let _task = rig.applier().spawn(rx, stx);
    let st = next(&mut srx).await;
    assert_eq!((st.generation, st.converged), (3, true));
    assert_eq!(rig.bus.driver(A).as_deref(), Some("vfio-pci"));
    Ok(())
}

#[tokio::test]
async fn changing_the_user_removes_the_old_block() -> Result<(), Box<dyn std::error::Error>> {
    let rig = Rig::new()?;
    let (tx, rx) = watch::channel(None);
    let (stx, mut srx) = mpsc::channel(8);
    let _task = rig.applier().spawn(rx, stx);
    let _ = tx.send(Some((1, spec(&[], "ops", vec![key("k", None)]))));
    assert!(next(&mut srx).await.converged);
    let _ = tx.send(Some((2, spec(&[], "alt", vec![key("k", None)]))));
    assert!(next(&mut srx).await.converged);
    assert!(!rig.keys_of("ops").contains("BEGIN"));
    assert!(rig.keys_of("alt").contains(" k\n"));
    let _ = tx.send(Some((3, spec(&[], "", vec![]))));
    assert!(next(&mut srx).await.converged);
    assert_eq!(rig.keys_of("alt"), "");
    Ok(())
}

#[test]
fn invalid_wire_spec_is_reported_not_applied() -> Result<(), Box<dyn std::error::Error>> {
    let rig = Rig::new()?;
    let mut wire = spec(&[(A, GpuDriver::VfioPci)], "", vec![]);
    if let Some(d) = wire.devices.as_mut() {
        d.gpus[0].driver = "nouveau".to_owned();
    }
    let mut state = AppliedState::default();
    let out = rig.applier().apply(&mut state, 1, &wire, &|| false);
    assert!(
        matches!(&out, ApplyOutcome::Failed { reason, .. } if reason == "InvalidSpec"),
        "{out:?}"
    );
    assert_eq!(state.observed_generation, 0);
    assert!(rig.bus.writes.lock().is_empty());
    Ok(())
}

#[tokio::test]
async fn an_unsafe_authorized_keys_is_reported_as_such_and_left_alone()
-> Result<(), Box<dyn std::error::Error>> {
    let rig = Rig::new()?;
    let shadow = rig.tmp.path().join("root/etc/shadow");
    std::fs::write(&shadow, "root:$6$hash:19000::::::\n")?;
    let ssh = rig.tmp.path().join("root/home/ops/.ssh");
    std::fs::create_dir_all(&ssh)?;
    std::fs::hard_link(&shadow, ssh.join("authorized_keys"))?;
    let (tx, rx) = watch::channel(None);
    let (stx, mut srx) = mpsc::channel(8);
    let _task = rig.applier().spawn(rx, stx);
    let _ = tx.send(Some((1, spec(&[], "ops", vec![key("k", None)]))));
    let st = next(&mut srx).await;
    assert_eq!(
        (st.converged, st.reason.as_str()),
        (false, "AuthorizedKeysUnsafe"),
        "{st:?}"
    );
    assert!(st.message.contains("hard links"), "{}", st.message);
    assert_eq!(
        std::fs::read_to_string(&shadow)?,
        "root:$6$hash:19000::::::\n"
    );
    Ok(())
}
