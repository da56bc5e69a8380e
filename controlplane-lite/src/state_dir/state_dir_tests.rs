//! Issue 19.5 and 19.6: an initialised state dir with a missing, empty or unreadable CA file or
//! store refuses to start naming the file; only a new dir is initialised; one process per dir.

use super::*;
use crate::server::open_state;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A dir initialised the way `bcctl serve` does it, then unlocked.
fn initialised() -> Result<(tempfile::TempDir, PathBuf, String), Box<dyn std::error::Error>> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("cp");
    let opened = open_state(&dir, "bc.test", Init::IfEmpty)?;
    let pin = opened.ca.pin()?;
    drop(opened);
    Ok((tmp, dir, pin))
}

fn refusal(dir: &Path) -> String {
    match open_state(dir, "bc.test", Init::IfEmpty) {
        Ok(_) => "started".to_owned(),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_new_dir_is_initialised_once_and_reopened_with_the_same_ca() -> TestResult {
    let (_tmp, dir, pin) = initialised()?;
    for f in [
        STORE_FILE,
        CA_KEY_FILE,
        CA_CERT_FILE,
        MARKER_FILE,
        "api-token",
        LOCK_FILE,
    ] {
        assert!(dir.join(f).is_file(), "{f}");
    }
    let again = open_state(&dir, "bc.test", Init::IfEmpty)?;
    assert_eq!(again.ca.pin()?, pin);
    drop(again);
    // --init on it is refused: it is not new.
    let err = open_state(&dir, "bc.test", Init::Explicit)
        .err()
        .ok_or("--init")?;
    assert!(err.to_string().contains("already initialised"), "{err}");
    Ok(())
}

#[test]
fn every_missing_or_broken_file_is_named_and_nothing_is_re_created() -> TestResult {
    type Break = fn(&Path) -> std::io::Result<()>;
    let cases: [(&str, Break, &str); 7] = [
        (CA_CERT_FILE, |p| fs::remove_file(p), "is missing"),
        (CA_KEY_FILE, |p| fs::remove_file(p), "is missing"),
        (STORE_FILE, |p| fs::remove_file(p), "is missing"),
        (STORE_FILE, |p| fs::write(p, b""), "is empty"),
        (
            STORE_FILE,
            |p| fs::write(p, b"not sqlite at all"),
            "not a SQLite",
        ),
        (CA_CERT_FILE, |p| fs::write(p, b""), "is empty"),
        // Unreadable (the tests run as root, so no mode would stop them): a directory.
        (
            CA_KEY_FILE,
            |p| fs::remove_file(p).and_then(|()| fs::create_dir(p)),
            "not a regular file",
        ),
    ];
    for (file, break_it, says) in cases {
        let (_tmp, dir, _) = initialised()?;
        let key_before = fs::read(dir.join(CA_KEY_FILE)).ok();
        break_it(&dir.join(file))?;
        let msg = refusal(&dir);
        assert!(
            msg.contains(&format!("{}", dir.join(file).display())) && msg.contains(says),
            "{file}: {msg}"
        );
        assert!(
            msg.contains("restore") && msg.contains("--init"),
            "the recovery: {msg}"
        );
        // Nothing was made in its place: no new CA, no empty store.
        if file != CA_KEY_FILE {
            assert_eq!(fs::read(dir.join(CA_KEY_FILE)).ok(), key_before, "{file}");
        }
        if file == STORE_FILE && says == "is missing" {
            assert!(!dir.join(STORE_FILE).exists(), "no empty store");
        }
    }
    Ok(())
}

#[test]
fn a_dir_without_the_marker_still_counts_as_initialised_by_its_files() -> TestResult {
    // A dir from before the marker: its files are the evidence.
    let (_tmp, dir, _) = initialised()?;
    fs::remove_file(dir.join(MARKER_FILE))?;
    fs::remove_file(dir.join(CA_CERT_FILE))?;
    let msg = refusal(&dir);
    assert!(msg.contains("ca.crt is missing"), "{msg}");
    // With the files whole it starts and gets the marker.
    let (_tmp2, dir2, _) = initialised()?;
    fs::remove_file(dir2.join(MARKER_FILE))?;
    drop(open_state(&dir2, "bc.test", Init::IfEmpty)?);
    assert!(dir2.join(MARKER_FILE).is_file());
    // The marker alone (every file gone) still says: initialised.
    for f in [STORE_FILE, CA_KEY_FILE, CA_CERT_FILE] {
        fs::remove_file(dir2.join(f))?;
    }
    assert!(
        refusal(&dir2).contains("state.db is missing"),
        "{}",
        refusal(&dir2)
    );
    Ok(())
}

#[test]
fn another_ca_or_a_key_of_another_ca_is_refused() -> TestResult {
    let (_tmp, dir, _) = initialised()?;
    let (_tmp2, other, _) = initialised()?;
    fs::copy(other.join(CA_CERT_FILE), dir.join(CA_CERT_FILE))?;
    let msg = refusal(&dir);
    assert!(
        msg.contains("does not belong") || msg.contains("is not the CA"),
        "{msg}"
    );
    fs::copy(other.join(CA_KEY_FILE), dir.join(CA_KEY_FILE))?;
    let msg = refusal(&dir);
    assert!(
        msg.contains("is not the CA this dir was initialised with"),
        "{msg}"
    );
    Ok(())
}

#[test]
fn only_an_empty_dir_is_initialised_without_init() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("cp");
    fs::create_dir(&dir)?;
    fs::write(dir.join("serve.log"), b"old log")?;
    let err = open_state(&dir, "bc.test", Init::IfEmpty)
        .err()
        .ok_or("not empty")?;
    let msg = err.to_string();
    assert!(msg.contains("serve.log") && msg.contains("--init"), "{msg}");
    assert!(!dir.join(CA_KEY_FILE).exists());
    drop(open_state(&dir, "bc.test", Init::Explicit)?);
    assert!(dir.join(MARKER_FILE).is_file());
    Ok(())
}

#[test]
fn a_second_holder_is_refused_naming_the_first_ones_pid() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let first = StateDir::lock(tmp.path())?;
    let err = StateDir::lock(tmp.path()).err().ok_or("locked")?;
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("pid {}", std::process::id())),
        "{msg}"
    );
    drop(first);
    drop(StateDir::lock(tmp.path())?);
    Ok(())
}

#[test]
fn the_dir_is_made_private_whatever_it_was() -> TestResult {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("cp");
    fs::create_dir(&dir)?;
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))?;
    drop(StateDir::lock(&dir)?);
    assert_eq!(fs::metadata(&dir)?.permissions().mode() & 0o777, 0o700);
    Ok(())
}

#[test]
fn a_store_sqlite_cannot_open_is_named() -> TestResult {
    // The header passes the integrity check; SQLite refuses the rest with a message that names
    // no file, so the start-up error names it.
    let (_tmp, dir, _) = initialised()?;
    let mut bytes = b"SQLite format 3\0".to_vec();
    bytes.extend(std::iter::repeat_n(0x5a, 8192));
    fs::write(dir.join(STORE_FILE), bytes)?;
    let msg = refusal(&dir);
    assert!(
        msg.contains(&format!("store {}", dir.join(STORE_FILE).display())),
        "{msg}"
    );
    Ok(())
}

#[test]
fn the_bmc_credentials_key_is_made_private_once_and_refused_when_exposed_or_lost() -> TestResult {
    use std::os::unix::fs::PermissionsExt;
    let (_tmp, dir, _pin) = initialised()?;
    let key = dir.join(BMC_KEY_FILE);
    // Made on first start, 0600, and the same key on every start after.
    assert_eq!(fs::metadata(&key)?.permissions().mode() & 0o777, 0o600);
    let first = fs::read_to_string(&key)?;
    drop(open_state(&dir, "bc.test", Init::IfEmpty)?);
    assert_eq!(fs::read_to_string(&key)?, first, "never re-made");
    // Readable by the group: refused, naming the file and the fix; nothing is changed.
    fs::set_permissions(&key, fs::Permissions::from_mode(0o640))?;
    let err = refusal(&dir);
    assert!(
        err.contains(BMC_KEY_FILE) && err.contains("chmod 600"),
        "{err}"
    );
    assert_eq!(fs::metadata(&key)?.permissions().mode() & 0o777, 0o640);
    fs::set_permissions(&key, fs::Permissions::from_mode(0o600))?;
    // Gone after it was made: refused (a new key would lose every sealed credential).
    fs::remove_file(&key)?;
    let err = refusal(&dir);
    assert!(
        err.contains(BMC_KEY_FILE) && err.contains("is missing"),
        "{err}"
    );
    assert!(!key.exists(), "not re-created");
    // Not a key: refused.
    fs::write(&key, b"zz\n")?;
    fs::set_permissions(&key, fs::Permissions::from_mode(0o600))?;
    let err = refusal(&dir);
    assert!(err.contains("hex-encoded"), "{err}");
    Ok(())
}

/// Writes `key` as the dir's `bmc-credentials.key` (0600), as an operator restoring the wrong
/// backup would.
fn replace_bmc_key(dir: &Path, key: &cpl_core::bare_metal::CredentialKey) -> TestResult {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(BMC_KEY_FILE);
    fs::write(&path, format!("{}\n", hex::encode(key.to_bytes())))?;
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600))?;
    Ok(())
}

/// Issue 30.7: another valid key is refused on SQLite as on PostgreSQL, naming the file, and
/// nothing is changed; the right key starts again.
#[test]
fn another_valid_bmc_credentials_key_is_refused_naming_the_file() -> TestResult {
    use cpl_core::bare_metal::CredentialKey;
    let (_tmp, dir, _pin) = initialised()?;
    let ours = fs::read_to_string(dir.join(BMC_KEY_FILE))?;
    replace_bmc_key(&dir, &CredentialKey::generate())?;
    let err = refusal(&dir);
    assert!(
        err.contains(&dir.join(BMC_KEY_FILE).display().to_string()),
        "{err}"
    );
    assert!(err.contains("not the key"), "{err}");
    fs::write(dir.join(BMC_KEY_FILE), &ours)?;
    drop(open_state(&dir, "bc.test", Init::IfEmpty)?);
    Ok(())
}

/// A store that sealed credentials before the digest was recorded: the first start with a key
/// that does not open them is refused instead of recording that key's digest.
#[test]
fn a_store_sealed_before_the_digest_was_recorded_is_checked_against_its_sealed_rows() -> TestResult
{
    use cpl_core::bare_metal::{CredentialKey, Credentials};
    let (_tmp, dir, _pin) = initialised()?;
    let old = CredentialKey::generate();
    let opened = open_state(&dir, "bc.test", Init::IfEmpty)?;
    opened.store.write_blocking(|tx| -> TestResult {
        tx.insert_node(&cpl_store::testing::new_node("node_m"), 1)?;
        let credentials = old.seal(
            "node_m",
            &Credentials {
                username: "admin".into(),
                password: "pw".into(),
            },
        )?;
        tx.put_bmc(&cpl_store::BmcRecord {
            node_id: "node_m".into(),
            address: "ipmi://10.0.0.5".into(),
            tls: "pin".into(),
            credentials,
            candidate: None,
            cert_sha256: None,
            facts: None,
            identifiers: vec![],
            macs: vec![],
            verified_at: None,
            verify_command_id: None,
            verify_started_at: None,
            last_error: None,
            power_expected: None,
            power_expected_at: None,
            reachable: None,
            created_at: 1,
            inspect: false,
            deployed: false,
            deployment: None,
            rescue: None,
        })?;
        tx.forget_meta("bmcCredentialKeySha256")?;
        Ok(())
    })?;
    drop(opened);
    // The dir's own key is not the one the row was sealed with: refused.
    let err = refusal(&dir);
    assert!(
        err.contains(BMC_KEY_FILE) && err.contains("node_m"),
        "{err}"
    );
    // The key it was sealed with starts, and from then on its digest is what counts.
    replace_bmc_key(&dir, &old)?;
    drop(open_state(&dir, "bc.test", Init::IfEmpty)?);
    replace_bmc_key(&dir, &CredentialKey::generate())?;
    assert!(refusal(&dir).contains("not the key"));
    Ok(())
}
