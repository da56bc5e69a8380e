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
