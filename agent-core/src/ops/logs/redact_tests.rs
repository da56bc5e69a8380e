use super::*;

/// Redacts `text` fed as one read; the output as a string, and the count.
fn run(text: &str) -> (String, u64) {
    let mut r = Redactor::default();
    let out = r.redact_all(text.as_bytes());
    (String::from_utf8_lossy(&out).into_owned(), r.count)
}

/// Redacts `text` fed in reads cut at `cuts` (byte offsets, ascending).
fn run_cut(text: &[u8], cuts: &[usize]) -> (String, u64) {
    let mut r = Redactor::default();
    let mut out = Vec::new();
    let mut at = 0;
    for &c in cuts {
        let c = c.clamp(at, text.len());
        r.push(&text[at..c], &mut out);
        at = c;
    }
    r.push(&text[at..], &mut out);
    r.finish(&mut out);
    (String::from_utf8_lossy(&out).into_owned(), r.count)
}

/// One of each secret the redactor covers, with the part that must never come out.
const SECRETS: [(&str, &str); 7] = [
    ("abc123.0123456789abcdef", "0123456789abcdef"),
    ("Authorization: Bearer eyJhbGciOi.payload.sig", "eyJhbGciOi"),
    (
        "authorization: bearer\t\tlowercasecredential",
        "lowercasecredential",
    ),
    ("bcctl --token bcapi_00ff11aa22", "00ff11aa22"),
    (
        "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIBsecretsecretsecret\n-----END EC PRIVATE KEY-----",
        "secretsecret",
    ),
    (
        "key=-----BEGIN OPENSSH PRIVATE KEY-----b3BlbnNzaC1rZXktdjEsecretsecret-----END OPENSSH PRIVATE KEY----- done",
        "secretsecret",
    ),
    ("https://alice:hunter2pass@example.com/x", "hunter2pass"),
];

#[test]
fn secrets_are_replaced_and_the_rest_kept() {
    let (out, n) = run(concat!(
        "joining with abc123.0123456789abcdef now\n",
        "-----BEGIN EC PRIVATE KEY-----\n",
        "MHcCAQEEIBsecretsecretsecret\n",
        "-----END EC PRIVATE KEY-----\n",
        "Authorization: Bearer eyJhbGciOi.payload.sig\n",
        "token bcapi_00ff11aa and version 1.2.3\n",
        "-----BEGIN CERTIFICATE-----\n",
    ));
    assert!(!out.contains("0123456789abcdef"), "{out}");
    assert!(!out.contains("secretsecret"), "{out}");
    assert!(!out.contains("eyJhbGciOi"), "{out}");
    assert!(!out.contains("00ff11aa"), "{out}");
    assert!(
        out.contains("joining with [REDACTED JOIN TOKEN] now"),
        "{out}"
    );
    assert!(out.contains(KEY_PLACEHOLDER));
    assert!(out.contains("Bearer [REDACTED]"));
    assert!(out.contains("version 1.2.3"), "{out}");
    // Certificates are public: kept.
    assert!(out.contains("BEGIN CERTIFICATE"));
    assert_eq!(n, 4);
}

#[test]
fn an_unterminated_key_block_hides_the_rest() {
    let (out, _) = run("-----BEGIN PRIVATE KEY-----\nAAAA\nBBBB\n");
    assert_eq!(out, KEY_PLACEHOLDER);
}

#[test]
fn a_url_password_goes_and_a_url_without_one_stays() {
    let (out, n) =
        run("fetch https://alice:hunter2@example.com/x and https://example.com:8443/y\n");
    assert_eq!(
        out,
        "fetch https://alice:[REDACTED]@example.com/x and https://example.com:8443/y\n"
    );
    assert_eq!(n, 1);
}

#[test]
fn every_secret_is_redacted_at_every_single_cut() {
    for (secret, sensitive) in SECRETS {
        let text = format!("before {secret} after\n");
        for cut in 0..=text.len() {
            let (out, n) = run_cut(text.as_bytes(), &[cut]);
            assert!(!out.contains(sensitive), "{secret:?} cut at {cut}: {out:?}");
            assert!(
                out.starts_with("before "),
                "{secret:?} cut at {cut}: {out:?}"
            );
            assert!(
                out.ends_with(" after\n"),
                "{secret:?} cut at {cut}: {out:?}"
            );
            assert_eq!(n, 1, "{secret:?} cut at {cut}: {out:?}");
        }
    }
}

#[test]
fn a_credential_longer_than_any_read_is_redacted_whole() {
    let body = "Zz9".repeat(100_000);
    let text = format!(
        "Authorization: Bearer {body} tail\nbcapi_{} end\n",
        "ab".repeat(90_000)
    );
    let cuts: Vec<usize> = (1..text.len()).step_by(4096).collect();
    let (out, n) = run_cut(text.as_bytes(), &cuts);
    assert_eq!(
        out,
        "Authorization: Bearer [REDACTED] tail\nbcapi_[REDACTED] end\n"
    );
    assert_eq!(n, 2);
}

#[test]
fn a_key_whose_begin_line_is_longer_than_64k_is_redacted() {
    let text = format!(
        "{}-----BEGIN RSA PRIVATE KEY-----\nMIIEsecretsecret\n-----END RSA PRIVATE KEY-----\nnext\n",
        "x ".repeat(40_000)
    );
    let cuts: Vec<usize> = (1..text.len()).step_by(65_536).collect();
    let (out, n) = run_cut(text.as_bytes(), &cuts);
    assert!(!out.contains("secretsecret"));
    assert!(
        out.ends_with(&format!("{KEY_PLACEHOLDER}\nnext\n")),
        "{}",
        &out[out.len() - 80..]
    );
    assert_eq!(n, 1);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

    /// Secrets at every offset from a read boundary (reads of every size up to 300 bytes, text
    /// before each secret of every length up to 600), several secrets per text: none survives,
    /// each is counted once, and the text around them comes out as it went in.
    #[test]
    fn no_secret_survives_any_cut(
        picks in proptest::collection::vec((0usize..SECRETS.len(), "[ xyzXYZ0-9,;\n]{0,600}"), 1..5),
        chunk in 1usize..300,
        tail in "[ xyzXYZ0-9,;\n]{0,50}",
    ) {
        let mut text = String::new();
        for (i, filler) in &picks {
            text.push_str(filler);
            text.push(' ');
            text.push_str(SECRETS[*i].0);
            text.push(' ');
        }
        text.push_str(&tail);
        let cuts: Vec<usize> = (chunk..text.len()).step_by(chunk).collect();
        let (out, n) = run_cut(text.as_bytes(), &cuts);
        for (i, _) in &picks {
            proptest::prop_assert!(!out.contains(SECRETS[*i].1), "{} survived in {:?}", SECRETS[*i].1, out);
        }
        proptest::prop_assert_eq!(n, picks.len() as u64);
        // Same result whatever the cuts.
        proptest::prop_assert_eq!(run(&text).0, out);
    }

    /// Text without secrets comes out byte for byte, however it is cut.
    #[test]
    fn text_without_secrets_is_unchanged(text in "[ xyzXYZ0-9,;\n\t]{0,2000}", chunk in 1usize..100) {
        let cuts: Vec<usize> = (chunk..text.len()).step_by(chunk).collect();
        let (out, n) = run_cut(text.as_bytes(), &cuts);
        proptest::prop_assert_eq!(out, text);
        proptest::prop_assert_eq!(n, 0);
    }

    #[test]
    fn no_token_survives(id in "[a-z0-9]{6}", secret in "[a-z0-9]{16}", pre in "[ -~]{0,20}") {
        let (out, _) = run(&format!("{pre} {id}.{secret} tail"));
        let token = format!("{id}.{secret}");
        proptest::prop_assert!(!out.contains(&token), "{} kept in {}", token, out);
    }
}

/// A secret this project issues or handles, and the part of it that must never come out.
struct Kind {
    what: &'static str,
    /// The secret as it is written.
    value: String,
    /// What must not survive (the secret half of a token, the password).
    sensitive: String,
}

fn kinds() -> Vec<Kind> {
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let password = "s3cr/et+Pa55-w0rd";
    let k = |what, value: String, sensitive: &str| Kind {
        what,
        value,
        sensitive: sensitive.to_owned(),
    };
    vec![
        // Join and site tokens: `<6>.<16>` of [a-z0-9] (cpl-store's create_token).
        k("join token", "abc123.0123456789abcdef".into(), "0123456789abcdef"),
        k("join token, digits", "9z9z9z.zzzzzzzzzz000000".into(), "zzzzzzzzzz000000"),
        // Boot tokens: `boot_<20>.<40>` (the ramdisk's kernel command line).
        k(
            "boot token",
            format!("boot_{}.{}", "a1".repeat(10), "q7".repeat(20)),
            &"q7".repeat(20),
        ),
        // Deploy identities: `deploy_<20>.<40>` (the config drive's bcd-join-token).
        k(
            "deploy identity",
            format!("deploy_{}.{}", "b2".repeat(10), "x8".repeat(20)),
            &"x8".repeat(20),
        ),
        // Operator API tokens: `bcapi_<48 hex>`.
        k("api token", format!("bcapi_{}", "0f".repeat(24)), &"0f".repeat(24)),
        k(
            "bearer",
            "Authorization: Bearer eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln".into(),
            "eyJzdWIiOiJ4In0",
        ),
        // BMC passwords: in ipmitool's environment, a Redfish URL, a Basic header, JSON.
        k("IPMI_PASSWORD", format!("IPMI_PASSWORD={password}"), password),
        k("env password", format!("Environment=BMC_PASSWORD={password}"), password),
        k("json password", format!(r#"{{"UserName": "admin", "Password": "{password}"}}"#), password),
        k("url password", format!("https://admin:{password}@10.0.0.5/redfish/v1"), password),
        k(
            "postgres url",
            format!("postgres://bcctl:{password}@db.example:5432/bc?sslmode=require"),
            password,
        ),
        k(
            "basic header",
            format!("Authorization: Basic {}", b64(&format!("admin:{password}"))),
            &b64(&format!("admin:{password}")),
        ),
        k(
            "basic alone",
            format!("auth=Basic {}", b64(&format!("root:{password}"))),
            &b64(&format!("root:{password}")),
        ),
        k(
            "quoted json authorization",
            format!(r#""authorization":"Basic {}""#, b64(&format!("root:{password}"))),
            &b64(&format!("root:{password}")),
        ),
        // Private keys: the node's and the CA's (PEM), an OpenSSH one.
        k(
            "ec key",
            "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIKeysecretkeysecret\n-----END EC PRIVATE KEY-----".into(),
            "Keysecretkeysecret",
        ),
        k(
            "openssh key",
            "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEKeysecret\n-----END OPENSSH PRIVATE KEY-----".into(),
            "KeysecretK".get(..9).unwrap_or_default(),
        ),
    ]
}

/// The places logs carry a secret: glued to word characters, in an environment variable's name,
/// a kernel command line, a journal line, JSON, a shell line, a quoted string.
fn contexts(s: &str) -> Vec<String> {
    vec![
        format!("plain {s} end"),
        format!("BCD_JOIN_TOKEN_{s} end"),
        format!("token{s} end"),
        format!("x9{s}"),
        format!("{s}_tail"),
        format!(
            "Command line: BOOT_IMAGE=/vmlinuz console=ttyS0 bcd.url=https://10.0.2.2:7443 bcd.token={s} bcd.node=node_x"
        ),
        format!("Mar 01 10:00:00 host bcd[412]: level=info msg=\"joining\" token={s} attempt=1"),
        format!(
            r#"{{"timestamp":"2026-01-01T00:00:00Z","fields":{{"message":"x","value":"{s}"}}}}"#
        ),
        format!("export BCD_JOIN_TOKEN='{s}'"),
        format!("ExecStart=/usr/bin/bcd agent --join-token={s}"),
        format!("[{s}]"),
    ]
}

/// Issue 30.6: every secret kind, in every place, at every single cut of the stream, is gone.
#[test]
fn the_corpus_of_every_secret_kind_in_every_place_is_redacted() {
    let mut failures = Vec::new();
    for kind in kinds() {
        for text in contexts(&kind.value) {
            let text = format!("{text}\nnext line\n");
            for cut in 0..=text.len() {
                let (out, n) = run_cut(text.as_bytes(), &[cut]);
                if out.contains(&kind.sensitive) || n == 0 {
                    failures.push(format!("{} cut at {cut} (n={n}): {out:?}", kind.what));
                    break;
                }
                if !out.ends_with("\nnext line\n") {
                    failures.push(format!("{}: text after it lost: {out:?}", kind.what));
                    break;
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} leaks:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// What looks like a secret's neighbour but is not one stays: a digest, a version, a host name,
/// `tokens: 5`, the word "basic" in prose, a URL with a port and a path.
#[test]
fn near_misses_are_kept() {
    for text in [
        "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n",
        "version 1.2.3 of bcd\n",
        "max_tokens: 5 tokens=7\n",
        "a basic check passed\n",
        "Basic setup done\n",
        "GET https://10.0.0.5:8443/redfish/v1/Systems/1 200\n",
        "token_id=abc123 joined\n",
        "host abcdef.0123456789abcdef0 is a name\n",
    ] {
        let (out, n) = run(text);
        assert_eq!((out.as_str(), n), (text, 0), "{text:?}");
    }
}

/// The corpus again, far from the start of the source (so the redactor decides each secret while
/// later bytes are still to come) and in reads of many sizes.
#[test]
fn the_corpus_is_redacted_in_reads_of_every_size_far_into_a_source() {
    let filler = "journal line without secrets 0123\n".repeat(20);
    for kind in kinds() {
        for text in contexts(&kind.value) {
            let text = format!("{filler}{text}\n{filler}");
            for chunk in [1usize, 2, 3, 7, 13, 64, 255, 256, 257, 300, 4096] {
                let cuts: Vec<usize> = (chunk..text.len()).step_by(chunk).collect();
                let (out, n) = run_cut(text.as_bytes(), &cuts);
                assert!(
                    !out.contains(&kind.sensitive) && n > 0,
                    "{} in reads of {chunk}: {out:?}",
                    kind.what
                );
                assert!(out.ends_with(&filler), "{}: text after it lost", kind.what);
                assert_eq!(run(&text).0, out, "{} in reads of {chunk}", kind.what);
            }
        }
    }
}
