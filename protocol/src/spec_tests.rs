use super::*;

// Generated with ssh-keygen for these tests; the private halves were thrown away.
const ED25519: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFoI/vRJxuXKIFpm08wZNESqDqg4OFGJz5u4IOqvbE7K t@x";
const ECDSA: &str = "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBPo6FMVwpVh4Ab6voHMuOAK1MSc+zSrHjLTzsFTWmBtsBbG1WRv+QX5JLcAjlodVh4mMoRn7XDviVEwWmm2AiuE=";
const RSA_3072: &str = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABgQCoO/5fU2gpl6vW+GfaixRRCl+Y2azw1Ws1rkM+JaGNYUHOYfGwaQQKsZW3j7fGuUu6O4eQ4kD2vZCrWBAOwYYx5tSwQ6BYCbW/hGShm2vNXQY7c34wncyIU1wXBIhjUNU6g4Sry7+qUQwit9jffrPAsmvfKuaDPh6MRM6aTSMV6gIB/pDkMVcnUtqqfg10MWPcpFyjXRBGYwEeTgIFeDT/NhKJOGgRnuGlbUefWA4AssP9CapiVaAgOXGqqWVu8tFLXryhtNDHqFVhEj/eN6Ge2JOOa0Ini9n5FRXfLu08kXe7dFfV3jQ0xFL+qTU2vaz9fTl+kSdRDXya/uIt+fwtf2SK1HgtMfHNkXMLNxS7o5ktCIdUalzF/Gd8N08V4kLyYmh16wUTaoUgdOIGgGFzv0i9LDhbiiXI0t810qArY6zVhWlv97oTdTC9/N7BiGxekfTB7i797FUhjN1inFLdKLqV7+JwICsYRM7ommwbkfufluFVqpq/uldhiRRUWTM=";
const RSA_1024: &str = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAgQCly8l2m6l5fwV1f3T7aHm7z5iNnegiKePWRzbm7cg5hs7Gyd24gW0mmHOEWZG9OphAOf/98NwxW2PjDJW7MMSkUP9ISsHPj9CdTfQxryEO/bswEaehKYcP8KMPF7FKbzxZwsOqgxLl/W0AForGny5oWYq5EHI6CteQ+MJCTGetww==";
const DSA: &str = "ssh-dss AAAAB3NzaC1kc3MAAACBANB23fFWK8FnhOPGf64zgR3vI1ZPKC4egfevLMae+JS69xZUl1dZZGevPycmEr1rlhEWWFrap1ZkVmuRS+gKWmXzTx6M37kkQCXYFRN6nVvBknNLK2oJp7BOXUHjoKIr9KKm0Kt3lgQ0l9KCSFVMCChHjoEjp2ozlz6np8x2dRUDAAAAFQC0cnthJVdAtks0OU1FIRmriXqw+wAAAIADjFab4t8DwKP+oOSg743XQmzncc4ojCpP95RJf+aZxmWf74S4WB4uFkKzDcUUhWtF7nQdBO6SaEHCD3eatUlmlyCA0bKIIokXOtaeg43IkpdP5736qlEIGheAFQSvyUutmibEkWipFJmusxrP9lYdE28AjBHGbZf89JoNAqMpWQAAAIBijcRN4vgsGh2jALV178Tlo/as7oNL68+aPgV25ME/2fyiI7/rCmuxsZNhVK1qSAkN//2bdwndTBfGNQ4tsVJnmv2kGTD4iXnZI79dOwNHWNcRe82C8ehgn4k/C0nt64eSq9+kT7jRwxLr1mZNQ5KDXMmK58Ej4F5qpkeuGuIMzg==";

const NOW_MS: i64 = 1_800_000_000_000;

fn ctx(known: Option<&[KnownGpu]>) -> ValidationContext<'_> {
    ValidationContext {
        now_ms: NOW_MS,
        trust: Trust::Platform,
        known_gpus: known,
    }
}

fn key(public_key: &str, expires_at_ms: Option<i64>) -> SshKey {
    SshKey {
        public_key: public_key.to_owned(),
        comment: "oncall".to_owned(),
        expires_at: expires_at_ms.and_then(|ms| Utc.timestamp_millis_opt(ms).single()),
    }
}

fn ssh_spec(keys: Vec<SshKey>) -> NodeSpec {
    NodeSpec {
        devices: Devices::default(),
        break_glass_ssh: Some(BreakGlassSsh {
            user: "ops".to_owned(),
            keys,
        }),
    }
}

fn known() -> Vec<KnownGpu> {
    vec![
        KnownGpu {
            uuid: Some("GPU-11111111-2222-3333-4444-555555555555".to_owned()),
            pci_address: Some("00000000:3B:00.0".to_owned()),
        },
        KnownGpu {
            uuid: Some("GPU-aaaaaaaa-2222-3333-4444-555555555555".to_owned()),
            pci_address: Some("0000:86:00.0".to_owned()),
        },
    ]
}

#[test]
fn json_shape_is_the_operator_apis() {
    let json = r#"{"devices":{"gpus":[
        {"match":{"uuid":"GPU-11111111-2222-3333-4444-555555555555"},"driver":"vfio-pci"},
        {"match":{"pciAddress":"0000:86:00.0"},"driver":"nvidia"}]},
      "breakGlassSsh":{"user":"ops","keys":[
        {"publicKey":"ssh-ed25519 AAAA","comment":"c","expiresAt":"2027-01-15T08:00:00Z"}]}}"#;
    let spec: NodeSpec = serde_json::from_str(json).unwrap_or_default();
    assert_eq!(spec.devices.gpus.len(), 2);
    assert_eq!(spec.devices.gpus[0].driver, GpuDriver::VfioPci);
    assert_eq!(
        spec.devices.gpus[1].match_,
        GpuMatch::PciAddress("0000:86:00.0".to_owned())
    );
    let ssh = spec.break_glass_ssh.clone().unwrap_or(BreakGlassSsh {
        user: String::new(),
        keys: vec![],
    });
    assert_eq!(ssh.user, "ops");
    assert_eq!(ssh.keys[0].expires_at_ms(), 1_800_000_000_000);
    let back = serde_json::to_value(&spec).unwrap_or_default();
    assert_eq!(
        back["breakGlassSsh"]["keys"][0]["publicKey"],
        "ssh-ed25519 AAAA"
    );
    assert_eq!(
        back["devices"]["gpus"][0]["match"]["uuid"],
        "GPU-11111111-2222-3333-4444-555555555555"
    );
    assert_eq!(
        back["breakGlassSsh"]["keys"][0]["expiresAt"],
        "2027-01-15T08:00:00Z"
    );
}

#[test]
fn unknown_fields_and_drivers_are_errors() {
    assert!(serde_json::from_str::<NodeSpec>(r#"{"device":{}}"#).is_err());
    assert!(
        serde_json::from_str::<NodeSpec>(
            r#"{"devices":{"gpus":[{"match":{"uuid":"x"},"driver":"nouveau"}]}}"#
        )
        .is_err()
    );
    assert!(
        serde_json::from_str::<NodeSpec>(
            r#"{"devices":{"gpus":[{"match":{"serial":"x"},"driver":"nvidia"}]}}"#
        )
        .is_err()
    );
}

#[test]
fn proto_round_trip_keeps_everything() {
    let mut spec = ssh_spec(vec![key(ED25519, Some(NOW_MS + 60_000)), key(ECDSA, None)]);
    spec.devices.gpus = vec![
        GpuBinding {
            match_: GpuMatch::Uuid("GPU-1".to_owned()),
            driver: GpuDriver::Nvidia,
        },
        GpuBinding {
            match_: GpuMatch::PciAddress("0000:3b:00.0".to_owned()),
            driver: GpuDriver::VfioPci,
        },
    ];
    let wire = pb::NodeSpec::from(&spec);
    assert_eq!(
        wire.break_glass_ssh
            .as_ref()
            .map(|b| b.keys[1].expires_at_ms),
        Some(0)
    );
    assert_eq!(NodeSpec::try_from(&wire), Ok(spec));
}

#[test]
fn proto_with_bad_driver_or_no_match_is_refused() {
    let wire = pb::NodeSpec {
        devices: Some(pb::Devices {
            gpus: vec![pb::GpuBinding {
                r#match: None,
                driver: "nvidia".to_owned(),
            }],
        }),
        break_glass_ssh: None,
    };
    assert_eq!(
        NodeSpec::try_from(&wire),
        Err(SpecError::MissingMatch { index: 0 })
    );
    let wire = pb::NodeSpec {
        devices: Some(pb::Devices {
            gpus: vec![pb::GpuBinding {
                r#match: Some(pb::gpu_binding::Match::Uuid("GPU-1".to_owned())),
                driver: "nouveau".to_owned(),
            }],
        }),
        break_glass_ssh: None,
    };
    assert_eq!(
        NodeSpec::try_from(&wire),
        Err(SpecError::UnknownDriver("nouveau".to_owned()))
    );
}

#[test]
fn good_keys_pass_and_bad_keys_are_named() {
    for k in [ED25519, ECDSA, RSA_3072] {
        assert_eq!(
            validate(&ssh_spec(vec![key(k, Some(NOW_MS + 1))]), &ctx(None)),
            Ok(()),
            "{k}"
        );
    }
    let cases = [
        (RSA_1024, "1024 bits"),
        (DSA, "DSA"),
        ("ssh-ed25519 AAAAnotbase64!!", "not an OpenSSH public key"),
        ("ssh-ed25519", "not an OpenSSH public key"),
        ("", "not an OpenSSH public key"),
    ];
    for (k, want) in cases {
        let err = validate(
            &ssh_spec(vec![key(ED25519, None), key(k, None)]),
            &ctx(None),
        );
        match err {
            Err(SpecError::InvalidSshKey { index: 1, reason }) => {
                assert!(reason.contains(want), "{k}: {reason}")
            }
            other => panic!("{k}: {other:?}"),
        }
    }
    // An options prefix or a second line would smuggle authority into authorized_keys.
    let with_options = format!("command=\"/bin/sh\" {ED25519}");
    let two_lines = format!("{ED25519}\n{ECDSA}");
    for k in [with_options.as_str(), two_lines.as_str()] {
        assert!(
            matches!(
                validate(&ssh_spec(vec![key(k, None)]), &ctx(None)),
                Err(SpecError::InvalidSshKey { index: 0, .. })
            ),
            "{k}"
        );
    }
}

#[test]
fn past_expiry_bad_comment_bad_user_are_refused() {
    assert!(matches!(
        validate(&ssh_spec(vec![key(ED25519, Some(NOW_MS))]), &ctx(None)),
        Err(SpecError::ExpiryInPast { index: 0, .. })
    ));
    let mut k = key(ED25519, None);
    k.comment = "x\nssh-ed25519 AAAA evil".to_owned();
    assert!(matches!(
        validate(&ssh_spec(vec![k]), &ctx(None)),
        Err(SpecError::InvalidComment(_))
    ));
    for user in ["", "Root", "a b", "../etc", "x".repeat(33).as_str(), "-x"] {
        let mut spec = ssh_spec(vec![]);
        if let Some(s) = spec.break_glass_ssh.as_mut() {
            s.user = user.to_owned();
        }
        assert_eq!(
            validate(&spec, &ctx(None)),
            Err(SpecError::InvalidUser(user.to_owned()))
        );
    }
    for user in ["ops", "_svc", "build-01", "machine$", "root"] {
        assert!(valid_user_name(user), "{user}");
    }
}

#[test]
fn tenant_controlled_node_gets_no_keys() {
    let spec = ssh_spec(vec![key(ED25519, None)]);
    let c = ValidationContext {
        trust: Trust::TenantControlled,
        ..ctx(None)
    };
    assert_eq!(
        validate(&spec, &c),
        Err(SpecError::KeysOnTenantControlledNode)
    );
    let stripped = spec.without_break_glass_keys();
    assert!(!stripped.has_break_glass_keys());
    assert_eq!(validate(&stripped, &c), Ok(()));
    let owned = ValidationContext {
        trust: Trust::TenantOwned,
        ..ctx(None)
    };
    assert_eq!(validate(&spec, &owned), Ok(()));
}

#[test]
fn devices_are_checked_against_inventory() {
    let known = known();
    let bind = |m: GpuMatch| GpuBinding {
        match_: m,
        driver: GpuDriver::VfioPci,
    };
    let mut spec = NodeSpec::default();
    spec.devices.gpus = vec![
        bind(GpuMatch::Uuid(
            "gpu-11111111-2222-3333-4444-555555555555".to_owned(),
        )),
        bind(GpuMatch::PciAddress("86:00.0".to_owned())),
    ];
    assert_eq!(validate(&spec, &ctx(Some(&known))), Ok(()));

    spec.devices
        .gpus
        .push(bind(GpuMatch::PciAddress("0000:af:00.0".to_owned())));
    assert!(matches!(
        validate(&spec, &ctx(Some(&known))),
        Err(SpecError::UnknownDevice { index: 2, .. })
    ));
    // Without an inventory only the shape is checked.
    assert_eq!(validate(&spec, &ctx(None)), Ok(()));

    // The same GPU by uuid and by bus id.
    spec.devices.gpus = vec![
        bind(GpuMatch::Uuid(
            "GPU-11111111-2222-3333-4444-555555555555".to_owned(),
        )),
        bind(GpuMatch::PciAddress("0000:3b:00.0".to_owned())),
    ];
    assert!(matches!(
        validate(&spec, &ctx(Some(&known))),
        Err(SpecError::DuplicateDevice { index: 1, .. })
    ));
    spec.devices.gpus = vec![bind(GpuMatch::PciAddress("3b:00".to_owned()))];
    assert!(matches!(
        validate(&spec, &ctx(None)),
        Err(SpecError::InvalidPciAddress { index: 0, .. })
    ));
}

#[test]
fn pci_addresses_normalize_to_sysfs_form() {
    assert_eq!(
        normalize_pci_address("00000000:3B:00.0").as_deref(),
        Some("0000:3b:00.0")
    );
    assert_eq!(
        normalize_pci_address("3b:00.1").as_deref(),
        Some("0000:3b:00.1")
    );
    assert_eq!(
        normalize_pci_address(" 0001:af:1f.7 ").as_deref(),
        Some("0001:af:1f.7")
    );
    for bad in [
        "",
        "3b",
        "0000:3b:20.0",
        "0000:3b:00.8",
        "zz:00.0",
        "0:0:0:0.0",
        "0000:100:00.0",
    ] {
        assert_eq!(normalize_pci_address(bad), None, "{bad}");
    }
}

#[test]
fn authorized_keys_line_is_canonical() {
    let k = key(&format!("  {ED25519}  "), None);
    let line = k.authorized_keys_line().unwrap_or_default();
    let mut want = ED25519
        .rsplit_once(' ')
        .map(|(a, _)| a)
        .unwrap_or_default()
        .to_owned();
    want.push_str(" oncall");
    assert_eq!(line, want);
    let own = SshKey {
        comment: String::new(),
        ..key(ED25519, None)
    };
    assert!(
        own.authorized_keys_line()
            .unwrap_or_default()
            .ends_with(" t@x")
    );
}
