//! JoinService in process (issue 19.14): a CSR whose key the CA cannot issue for correctly is
//! refused before the token is spent, naming the key type; ECDSA P-256 joins.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use bc_protocol::pb::join_server::Join;
use bc_protocol::pb::{HardwareIdentity, JoinRequest};
use cpl_store::{NewToken, now_ms};
use rcgen::{CertificateParams, KeyPair};

use super::join::{JoinService, RateLimiter};
use crate::ca::CertificateAuthority;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn service(dir: &std::path::Path) -> Result<(JoinService, String), Box<dyn std::error::Error>> {
    let store = cpl_store::testing::store()?;
    let (_, token) = store.write_blocking(|tx| {
        tx.create_token(
            &NewToken {
                ttl_ms: 3_600_000,
                max_uses: Some(5),
                ..Default::default()
            },
            now_ms(),
        )
    })?;
    let commands = cpl_core::commands::Commands {
        store: store.clone(),
        sessions: Arc::new(cpl_core::port::NoSessions),
    };
    let svc = JoinService {
        bare_metal: cpl_core::bare_metal::BareMetal::new(
            commands,
            cpl_core::bare_metal::CredentialKey::generate(),
            Default::default(),
        ),
        store,
        ca: Arc::new(CertificateAuthority::create(dir, "bc.test")?),
        heartbeat_interval: Duration::from_secs(10),
        node_cert_ttl: Duration::from_secs(3600),
        registry: Arc::default(),
        limiter: Arc::new(RateLimiter::new(0)),
        metrics: crate::metrics::Metrics::new(),
    };
    Ok((svc, token))
}

fn rcgen_csr(alg: &'static rcgen::SignatureAlgorithm) -> Result<String, rcgen::Error> {
    let key = KeyPair::generate_for(alg)?;
    CertificateParams::new(Vec::<String>::new())?
        .serialize_request(&key)?
        .pem()
}

/// A CSR with a key openssl makes (`-newkey` arguments), or `None` without openssl (said loudly;
/// under `CI=true` a failure).
fn openssl_csr(newkey: &[&str]) -> Option<String> {
    let dir = tempfile::tempdir().ok()?;
    let out = Command::new("openssl")
        .args(["req", "-new", "-nodes", "-subj", "/CN=x", "-newkey"])
        .args(newkey)
        .arg("-keyout")
        .arg(dir.path().join("k.pem"))
        .arg("-out")
        .arg(dir.path().join("csr.pem"))
        .output();
    match out {
        Ok(o) if o.status.success() => std::fs::read_to_string(dir.path().join("csr.pem")).ok(),
        other => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "openssl is needed for this test: {other:?}"
            );
            eprintln!("!!! openssl unavailable ({other:?}); skipping the {newkey:?} case");
            None
        }
    }
}

async fn join(svc: &JoinService, token: &str, csr: String) -> Result<String, tonic::Status> {
    let req = JoinRequest {
        token: token.to_owned(),
        csr_pem: csr,
        hardware: Some(HardwareIdentity::default()),
        hostname: "h".into(),
        ..Default::default()
    };
    Ok(svc
        .join(tonic::Request::new(req))
        .await?
        .into_inner()
        .node_id)
}

#[tokio::test]
async fn only_ecdsa_p256_keys_join_and_others_are_refused_before_the_token_is_spent() -> TestResult
{
    let tmp = tempfile::tempdir()?;
    let (svc, token) = service(tmp.path())?;
    let mut cases: Vec<(&str, String)> = vec![
        ("ECDSA P-384", rcgen_csr(&rcgen::PKCS_ECDSA_P384_SHA384)?),
        ("Ed25519", rcgen_csr(&rcgen::PKCS_ED25519)?),
    ];
    for (name, newkey) in [
        (
            "ECDSA P-521",
            &["ec", "-pkeyopt", "ec_paramgen_curve:P-521"][..],
        ),
        (
            "ECDSA secp256k1",
            &["ec", "-pkeyopt", "ec_paramgen_curve:secp256k1"][..],
        ),
        ("RSA-1024", &["rsa:1024"][..]),
        ("RSA-2048", &["rsa:2048"][..]),
    ] {
        if let Some(csr) = openssl_csr(newkey) {
            cases.push((name, csr));
        }
    }
    for (name, csr) in cases {
        assert_eq!(crate::ca::csr_key_type(&csr)?, name);
        let status = join(&svc, &token, csr).await.err().ok_or(name)?;
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{name}");
        assert!(
            status.message().contains(name) && status.message().contains("ECDSA P-256"),
            "{name}: {}",
            status.message()
        );
    }
    let tokens = svc.store.read_blocking(|r| r.tokens())?;
    assert_eq!(tokens[0].uses, 0, "no use spent on a refused key type");
    assert!(
        svc.store.read_blocking(|r| r.nodes())?.is_empty(),
        "no node"
    );
    // The key type bcd makes joins, and gets a certificate for that key.
    let p256 = rcgen_csr(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    assert_eq!(crate::ca::csr_key_type(&p256)?, "ECDSA P-256");
    let id = join(&svc, &token, p256).await?;
    assert!(id.starts_with("node_"));
    // Renewal signs through the same check.
    let p384 = rcgen_csr(&rcgen::PKCS_ECDSA_P384_SHA384)?;
    let err = svc
        .ca
        .sign_node_csr(&p384, &id, 1, Duration::from_secs(60))
        .err()
        .ok_or("renewal with P-384")?;
    assert!(err.to_string().contains("ECDSA P-384"), "{err}");
    Ok(())
}
