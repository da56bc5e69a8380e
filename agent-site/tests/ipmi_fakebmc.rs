//! The IPMI driver (ipmitool) against a real pyghmi fakebmc on a loopback UDP port: power
//! on/off/status, a reboot, the boot device (PXE, disk persistent) read back, a wrong password
//! (`BMC_AUTH_FAILED`) and nothing listening (`BMC_UNREACHABLE`), and the password never on
//! ipmitool's command line. Without fakebmc or ipmitool the test says so and skips; under
//! `CI=true` it fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use bc_protocol::commands::CommandErrorCode;
use bc_protocol::commands::bmc::{BootDevice, PowerAction, PowerState};
use bcd_site::test_utils::fakebmc::FakeBmcProcess;
use bcd_site::test_utils::{PASSWORD, free_udp_port};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipmi_power_boot_device_and_failures_against_fakebmc() {
    let Some(fake) = FakeBmcProcess::start("ipmi").await else {
        return;
    };
    // ipmitool through a recording wrapper: what its command line and environment carried.
    let rec = tempfile::tempdir().unwrap();
    let log = rec.path().join("argv.log");
    let wrapper = rec.path().join("ipmitool");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\necho \"argv: $*\" >> '{log}'\n[ -n \"$IPMI_PASSWORD\" ] && echo 'env: IPMI_PASSWORD set' >> '{log}'\nexec '{real}' \"$@\"\n",
            log = log.display(),
            real = fake.ipmitool.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let mut cfg = config();
    cfg.ipmitool = wrapper;
    let site = site(cfg);
    let nowhere = format!("ipmi://127.0.0.1:{}", free_udp_port());
    site.apply(assignment(vec![
        bmc("node_ipmi", &fake.address(), None),
        bmc("node_badpw", &fake.address(), Some("wrong-password")),
        bmc("node_nowhere", &nowhere, None),
    ]));

    let f = verify(&site, "node_ipmi").await.unwrap();
    assert_eq!(f.power, PowerState::Off);
    assert!(f.nics.is_empty(), "IPMI lists no NICs");

    let r = power(&site, "node_ipmi", PowerAction::On).await.unwrap();
    assert_eq!(r.power, PowerState::On);
    assert!(
        fake.ipmitool(&["chassis", "power", "status"])
            .unwrap()
            .contains("is on")
    );
    let r = power(&site, "node_ipmi", PowerAction::Reboot)
        .await
        .unwrap();
    assert_eq!(r.power, PowerState::On);
    let r = power(&site, "node_ipmi", PowerAction::Off).await.unwrap();
    assert_eq!(r.power, PowerState::Off);
    assert!(
        fake.ipmitool(&["chassis", "power", "status"])
            .unwrap()
            .contains("is off")
    );
    // A reboot of a machine that is off powers it on.
    let r = power(&site, "node_ipmi", PowerAction::Reboot)
        .await
        .unwrap();
    assert_eq!(r.power, PowerState::On);
    let r = power(&site, "node_ipmi", PowerAction::SoftOff)
        .await
        .unwrap();
    assert_eq!(r.power, PowerState::Off);

    let b = boot(&site, "node_ipmi", BootDevice::Pxe, false)
        .await
        .unwrap();
    assert_eq!(
        (b.device, b.persistent),
        (Some(BootDevice::Pxe), Some(false))
    );
    let flags = fake
        .ipmitool(&["chassis", "bootparam", "get", "5"])
        .unwrap();
    assert!(flags.contains("Force PXE"), "{flags}");
    let b = boot(&site, "node_ipmi", BootDevice::Disk, true)
        .await
        .unwrap();
    // fakebmc keeps the device but not the persistence flag (it always says "next boot").
    assert_eq!(b.device, Some(BootDevice::Disk));

    let e = verify(&site, "node_badpw")
        .await
        .expect_err("wrong password");
    assert_eq!(e.code, CommandErrorCode::BmcAuthFailed, "{e}");
    assert!(e.message.contains(&fake.address()), "{e}");
    assert!(!e.message.contains("wrong-password"), "{e}");
    let e = verify(&site, "node_nowhere")
        .await
        .expect_err("nothing listens");
    assert_eq!(e.code, CommandErrorCode::BmcUnreachable, "{e}");
    assert!(e.message.contains(&nowhere), "{e}");
    assert!(!e.message.contains(PASSWORD), "{e}");

    let seen = std::fs::read_to_string(&log).unwrap();
    assert!(seen.contains("argv: -I lanplus -H 127.0.0.1"), "{seen}");
    assert!(seen.contains(" -E "), "{seen}");
    assert!(seen.contains("env: IPMI_PASSWORD set"), "{seen}");
    assert!(
        !seen.contains(PASSWORD),
        "the password was on a command line: {seen}"
    );
}
