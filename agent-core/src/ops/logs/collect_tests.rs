use super::*;

fn untar(path: &Path) -> Vec<(String, String)> {
    let Ok(f) = File::open(path) else {
        return Vec::new();
    };
    let mut ar = tar::Archive::new(flate2::read::GzDecoder::new(f));
    let mut out = Vec::new();
    if let Ok(entries) = ar.entries() {
        for mut e in entries.flatten() {
            let name = e
                .path()
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            let mut s = String::new();
            let _ = e.read_to_string(&mut s);
            out.push((name, s));
        }
    }
    out
}

fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    let _ = std::fs::write(&p, format!("#!/bin/sh\n{body}\n"));
    let _ = std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755));
    p
}

/// `cfg` reading the kernel log of the host under `root`.
fn at(cfg: &OpsConfig, root: &Path) -> OpsConfig {
    OpsConfig {
        kmsg: root.join("dev/kmsg"),
        ..cfg.clone()
    }
}

#[test]
fn bundle_holds_redacted_sources_and_a_manifest() -> Result<(), Box<dyn std::error::Error>> {
    let tmp = tempfile::tempdir()?;
    std::fs::create_dir_all(tmp.path().join("root/dev"))?;
    std::fs::write(
        tmp.path().join("root/dev/kmsg"),
        "6,1,100,-;NVRM: Xid (PCI:0000:1a:00): 79\n6,2,200,-;hello kernel\n",
    )?;
    let cfg = OpsConfig {
        journalctl: script(
            tmp.path(),
            "journalctl",
            "echo \"args: $*\"\necho 'join abc123.0123456789abcdef'\necho 'Authorization: Bearer sekrit'",
        ),
        ..OpsConfig::default()
    };
    let b = collect(
        &at(&cfg, &tmp.path().join("root")),
        &CollectArgs::default(),
        None,
    )?;
    let files = untar(&b.path);
    let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, vec!["manifest.json", "journal.log", "kernel.log"]);
    let journal = &files[1].1;
    assert!(journal.contains("--no-pager"), "{journal}");
    assert!(
        !journal.contains("0123456789abcdef") && !journal.contains("sekrit"),
        "{journal}"
    );
    assert!(files[2].1.contains("hello kernel"));
    let m: Manifest = serde_json::from_str(&files[0].1)?;
    assert!(!m.truncated);
    assert_eq!(m.sources[0].redactions, 2);
    assert_eq!(m.sources[2].status, SourceStatus::Missing);
    assert_eq!(b.bytes, std::fs::metadata(&b.path)?.len());
    assert_eq!(
        b.sha256,
        hex::encode(Sha256::digest(std::fs::read(&b.path)?))
    );
    Ok(())
}

#[test]
fn missing_sources_are_noted_and_max_bytes_cuts() -> Result<(), Box<dyn std::error::Error>> {
    let tmp = tempfile::tempdir()?;
    let cfg = OpsConfig {
        journalctl: script(
            tmp.path(),
            "journalctl",
            "i=0; while [ $i -lt 5000 ]; do echo line $i; i=$((i+1)); done",
        ),
        log_file: Some(tmp.path().join("nope.log")),
        ..OpsConfig::default()
    };
    let root = tmp.path().join("no-root");
    let args = CollectArgs {
        max_bytes: Some(1000),
        ..CollectArgs::default()
    };
    let b = collect(&at(&cfg, &root), &args, None)?;
    assert!(b.manifest.truncated);
    let j = &b.manifest.sources[0];
    assert_eq!(j.status, SourceStatus::Truncated);
    assert!(j.bytes <= 1000 && j.bytes > 900, "{j:?}");
    assert_eq!(b.manifest.sources[1].status, SourceStatus::Missing);
    assert_eq!(b.manifest.sources[2].status, SourceStatus::Missing);

    let cfg = OpsConfig {
        journalctl: tmp.path().join("no-journalctl"),
        ..OpsConfig::default()
    };
    let b = collect(&at(&cfg, &root), &CollectArgs::default(), None)?;
    let j = &b.manifest.sources[0];
    assert_eq!(j.status, SourceStatus::Missing);
    assert!(
        j.reason
            .as_deref()
            .is_some_and(|r| r.contains("no-journalctl")),
        "{j:?}"
    );

    // A failing journalctl that floods stderr neither hangs nor loses what it printed.
    let cfg = OpsConfig {
        journalctl: script(
            tmp.path(),
            "journalctl-bad",
            "echo kept line\nhead -c 300000 /dev/zero | tr '\\0' e >&2\nexit 2",
        ),
        ..OpsConfig::default()
    };
    let b = collect(&at(&cfg, &root), &CollectArgs::default(), None)?;
    let j = &b.manifest.sources[0];
    assert_eq!(j.status, SourceStatus::Failed, "{j:?}");
    assert_eq!(j.bytes, "kept line\n".len() as u64);
    assert!(
        j.reason.as_deref().is_some_and(|r| r.contains("exited")),
        "{j:?}"
    );
    Ok(())
}

/// `text` through the source path (reader, redaction, line cut, budget) as a file's bytes.
fn staged(text: &[u8]) -> Result<String, Box<dyn std::error::Error>> {
    let tmp = tempfile::tempdir()?;
    let mut budget = DEFAULT_MAX_BYTES;
    let st = stage_reader(Source::Journal, text, tmp.path(), &mut budget)?;
    let path = st.path.ok_or("no staged file")?;
    Ok(std::fs::read_to_string(path)?)
}

#[test]
fn a_join_token_cut_by_the_64k_line_split_is_still_redacted()
-> Result<(), Box<dyn std::error::Error>> {
    let token = "abc123.0123456789abcdef";
    let split = usize::try_from(MAX_LINE_BYTES)?;
    // The line split falls before, inside and after the token.
    for cut in 0..=token.len() + 1 {
        let mut line = " ".repeat(split - cut);
        line.push_str(token);
        line.push_str(" joined\n");
        let out = staged(line.as_bytes())?;
        assert!(
            !out.contains("0123456789abcdef"),
            "cut at {cut}: token kept"
        );
        assert!(!out.contains("abc123."), "cut at {cut}: token kept");
    }
    Ok(())
}

#[test]
fn a_private_key_whose_begin_line_passes_64k_is_still_redacted()
-> Result<(), Box<dyn std::error::Error>> {
    let begin = "-----BEGIN RSA PRIVATE KEY-----";
    let split = usize::try_from(MAX_LINE_BYTES)?;
    for cut in 0..=begin.len() + 1 {
        let mut text = " ".repeat(split - cut);
        text.push_str(begin);
        text.push_str(
            "\nMIIEowIBAAKCAQEAsecretkeymaterial\n-----END RSA PRIVATE KEY-----\nafter\n",
        );
        let out = staged(text.as_bytes())?;
        assert!(!out.contains("secretkeymaterial"), "cut at {cut}: key kept");
        assert!(
            out.contains("after"),
            "cut at {cut}: {}",
            &out[out.len().saturating_sub(200)..]
        );
    }
    Ok(())
}

#[test]
fn the_real_kmsg_is_read_to_its_end_without_blocking() -> Result<(), Box<dyn std::error::Error>> {
    // Whatever this machine allows: collected (non-blocking read stops at the end of the
    // ring buffer) or missing (no permission), never a hang.
    let args = CollectArgs {
        sources: Some(vec![Source::Kernel]),
        ..CollectArgs::default()
    };
    let b = collect(&OpsConfig::default(), &args, None)?;
    let k = &b.manifest.sources[0];
    assert!(
        matches!(k.status, SourceStatus::Collected | SourceStatus::Missing),
        "{k:?}"
    );
    Ok(())
}
