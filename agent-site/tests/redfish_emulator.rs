//! The Redfish driver against a real sushy-tools emulator (fake systems driver) on a loopback
//! port: verify (a good BMC, a wrong password, nothing listening, a path that is not a system,
//! several systems without a path), power actions and the boot override read back from the
//! emulator, and the TLS modes (pin recorded at first contact, then only that certificate).
//! Without sushy-emulator these tests say so and skip; under `CI=true` they fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use bc_protocol::commands::CommandErrorCode;
use bc_protocol::commands::bmc::{BootDevice, PowerAction, PowerState};
use bc_protocol::pb;
use bcd_site::test_utils::proxy::FaultProxy;
use bcd_site::test_utils::sushy::{FakeSystem, Sushy, self_signed};
use bcd_site::test_utils::{PASSWORD, free_tcp_port};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_reads_the_system_and_names_what_went_wrong() {
    let mut two_nics = FakeSystem::numbered(2);
    two_nics.macs = vec!["52:54:00:AB:CD:EF".into(), "52:54:00:12:34:57".into()];
    two_nics.on = true;
    let systems = [FakeSystem::numbered(1), two_nics, FakeSystem::numbered(3)];
    let Some(sushy) = Sushy::start("verify", &systems, None).await else {
        return;
    };
    let nowhere = format!(
        "redfish+http://127.0.0.1:{}/redfish/v1/Systems/x",
        free_tcp_port()
    );
    let site = site(config());
    site.apply(assignment(vec![
        bmc("node_good", &sushy.address(&systems[1].uuid), None),
        bmc(
            "node_badpw",
            &sushy.address(&systems[0].uuid),
            Some("wrong-password"),
        ),
        bmc("node_nowhere", &nowhere, None),
        bmc(
            "node_nosys",
            &sushy.address("99999999-0000-0000-0000-000000000000"),
            None,
        ),
        bmc("node_many", &sushy.root_address(), None),
        bmc(
            "node_chassis",
            &format!("{}/redfish/v1/Chassis/1", sushy.root_address()),
            None,
        ),
        // A credential rotation under test: the current password is wrong, the candidate right.
        pb::ManagedBmc {
            candidate: Some(endpoint(&sushy.address(&systems[2].uuid), PASSWORD)),
            ..bmc(
                "node_rotating",
                &sushy.address(&systems[2].uuid),
                Some("old-password"),
            )
        },
    ]));

    let f = verify(&site, "node_good").await.unwrap();
    assert_eq!(f.uuid.as_deref(), Some(systems[1].uuid.as_str()));
    assert_eq!(f.serial.as_deref(), Some("SER-2"));
    assert_eq!(f.manufacturer.as_deref(), Some("Sushy Emulator"));
    assert_eq!(f.model.as_deref(), Some("Emulated node-2"));
    assert_eq!(f.power, PowerState::On);
    assert_eq!(
        f.system_path,
        format!("/redfish/v1/Systems/{}", systems[1].uuid)
    );
    let macs: Vec<&str> = f.nics.iter().map(|n| n.mac.as_str()).collect();
    assert_eq!(macs, ["52:54:00:12:34:57", "52:54:00:ab:cd:ef"]);
    assert_eq!(f.cert_sha256, None, "plain http has no certificate");

    let cases = [
        ("node_badpw", CommandErrorCode::BmcAuthFailed, "401"),
        (
            "node_nowhere",
            CommandErrorCode::BmcUnreachable,
            "127.0.0.1",
        ),
        ("node_nosys", CommandErrorCode::BmcNotASystem, "404"),
        ("node_many", CommandErrorCode::BmcNotASystem, "3 systems"),
        (
            "node_chassis",
            CommandErrorCode::BmcNotASystem,
            "/redfish/v1/Chassis/1",
        ),
    ];
    for (node, code, says) in cases {
        let e = verify(&site, node).await.expect_err(node);
        assert_eq!(e.code, code, "{node}: {e}");
        assert!(e.message.contains(says), "{node}: {e}");
        assert!(
            e.message.contains("127.0.0.1"),
            "{node}: the BMC is named: {e}"
        );
        assert!(!e.message.contains(PASSWORD), "{node}: {e}");
        assert!(!e.message.contains("wrong-password"), "{node}: {e}");
    }
    let e = verify(&site, "node_unknown").await.expect_err("unknown");
    assert_eq!(e.code, CommandErrorCode::BmcUnknown);
    let e = verify(&site, "node_rotating")
        .await
        .expect_err("old password");
    assert_eq!(e.code, CommandErrorCode::BmcAuthFailed);
    let f = verify_candidate(&site, "node_rotating").await.unwrap();
    assert_eq!(f.uuid.as_deref(), Some(systems[2].uuid.as_str()));
    let e = verify_candidate(&site, "node_good")
        .await
        .expect_err("no candidate");
    assert_eq!(e.code, CommandErrorCode::BmcUnknown);
    let e = power_at(&site, "node_good", PowerAction::Off, EPOCH + 1)
        .await
        .expect_err("stale epoch");
    assert_eq!(e.code, CommandErrorCode::LeaseLost);
    assert_eq!(
        sushy.power(&systems[1].uuid).await,
        "On",
        "nothing was done"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_and_boot_device_reach_the_emulator() {
    let systems = [FakeSystem::numbered(7)];
    let uuid = systems[0].uuid.clone();
    let Some(sushy) = Sushy::start("power and boot device", &systems, None).await else {
        return;
    };
    // Through a recording proxy: the emulator ignores BootSourceOverrideEnabled, so what was
    // sent is read at the proxy. The address has no system path: the service's only system.
    let proxy = FaultProxy::start(sushy.socket()).await;
    let site = site(config());
    site.apply(assignment(vec![bmc("node_7", &proxy.address(""), None)]));

    let r = power(&site, "node_7", PowerAction::On).await.unwrap();
    assert_eq!(r.power, PowerState::On);
    assert_eq!(sushy.power(&uuid).await, "On");
    let r = power(&site, "node_7", PowerAction::Off).await.unwrap();
    assert_eq!(r.power, PowerState::Off);
    assert_eq!(sushy.power(&uuid).await, "Off");
    power(&site, "node_7", PowerAction::On).await.unwrap();
    let r = power(&site, "node_7", PowerAction::Reboot).await.unwrap();
    assert_eq!(r.power, PowerState::On, "a reboot ends powered on");
    let r = power(&site, "node_7", PowerAction::SoftOff).await.unwrap();
    assert_eq!(r.power, PowerState::Off);
    let resets: Vec<String> = proxy
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST")
        .map(|r| r.body)
        .collect();
    assert_eq!(resets.len(), 5, "{resets:?}");
    for (body, t) in resets
        .iter()
        .zip(["On", "ForceOff", "On", "ForceRestart", "GracefulShutdown"])
    {
        assert!(body.contains(&format!("\"ResetType\":\"{t}\"")), "{body}");
    }

    let r = boot(&site, "node_7", BootDevice::Pxe, false).await.unwrap();
    assert_eq!(r.device, Some(BootDevice::Pxe));
    let doc = sushy.system(&uuid).await;
    assert_eq!(doc["Boot"]["BootSourceOverrideTarget"], "Pxe");
    let patch = proxy
        .requests()
        .into_iter()
        .rfind(|r| r.method == "PATCH")
        .expect("a PATCH");
    assert!(
        patch
            .body
            .contains("\"BootSourceOverrideEnabled\":\"Once\"")
            && patch.body.contains("\"BootSourceOverrideTarget\":\"Pxe\""),
        "{}",
        patch.body
    );
    let r = boot(&site, "node_7", BootDevice::Disk, true).await.unwrap();
    assert_eq!(
        (r.device, r.persistent),
        (Some(BootDevice::Disk), Some(true))
    );
    assert_eq!(
        sushy.system(&uuid).await["Boot"]["BootSourceOverrideTarget"],
        "Hdd"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_pin_is_recorded_at_first_contact_and_only_that_certificate_is_accepted_after() {
    let certs = tempfile::tempdir().unwrap();
    let (a_crt, a_key, a_fp) = self_signed(certs.path(), "a");
    let (b_crt, b_key, _) = self_signed(certs.path(), "b");
    let systems = [FakeSystem::numbered(9)];
    let Some(bmc_a) = Sushy::start("tls pin", &systems, Some((&a_crt, &a_key))).await else {
        return;
    };
    let Some(bmc_b) = Sushy::start("tls pin", &systems, Some((&b_crt, &b_key))).await else {
        return;
    };
    let addr_a = bmc_a.address(&systems[0].uuid);
    let addr_b = bmc_b.address(&systems[0].uuid);
    assert!(addr_a.starts_with("redfish+https://"), "{addr_a}");
    let with = |node: &str, address: &str, tls: pb::BmcTlsMode, pin: &str| pb::ManagedBmc {
        node_id: node.to_owned(),
        endpoint: Some(pb::BmcEndpoint {
            tls: tls.into(),
            cert_sha256: pin.to_owned(),
            ..endpoint(address, PASSWORD)
        }),
        candidate: None,
        sync_power: false,
        boot: None,
    };
    let site = site(config());
    site.apply(assignment(vec![
        with("first", &addr_a, pb::BmcTlsMode::Pin, ""),
        with("webpki", &addr_a, pb::BmcTlsMode::Verify, ""),
        with("insecure", &addr_a, pb::BmcTlsMode::Insecure, ""),
    ]));
    // First contact: any certificate, recorded.
    let f = verify(&site, "first").await.unwrap();
    assert_eq!(f.cert_sha256.as_deref(), Some(a_fp.as_str()));
    // Nothing but bmc.verify works before a pin is recorded.
    let e = power(&site, "first", PowerAction::On)
        .await
        .expect_err("no pin yet");
    assert_eq!(e.code, CommandErrorCode::BmcTlsMismatch, "{e}");
    // A self-signed certificate does not verify against the WebPKI roots.
    let e = verify(&site, "webpki").await.expect_err("self-signed");
    assert_eq!(e.code, CommandErrorCode::BmcTlsMismatch, "{e}");
    assert!(e.message.contains(&a_fp), "{e}");
    // Insecure: accepted (and warned about).
    assert!(verify(&site, "insecure").await.is_ok());

    // Pinned: the recorded certificate is accepted, another one is not.
    site.apply(assignment(vec![
        with("pinned", &addr_a, pb::BmcTlsMode::Pin, &a_fp.to_uppercase()),
        with("impostor", &addr_b, pb::BmcTlsMode::Pin, &a_fp),
    ]));
    let f = verify(&site, "pinned").await.unwrap();
    assert_eq!(f.cert_sha256.as_deref(), Some(a_fp.as_str()));
    let r = power(&site, "pinned", PowerAction::On).await.unwrap();
    assert_eq!(r.power, PowerState::On);
    let e = verify(&site, "impostor")
        .await
        .expect_err("another certificate");
    assert_eq!(e.code, CommandErrorCode::BmcTlsMismatch, "{e}");
    assert!(e.message.contains(&a_fp), "{e}");
    assert_eq!(bmc_b.power(&systems[0].uuid).await, "Off");
    let e = power(&site, "impostor", PowerAction::On)
        .await
        .expect_err("impostor");
    assert_eq!(e.code, CommandErrorCode::BmcTlsMismatch);
    assert_eq!(
        bmc_b.power(&systems[0].uuid).await,
        "Off",
        "nothing reached it"
    );
}
