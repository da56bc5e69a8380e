use std::fs::File;
use std::os::unix::fs::MetadataExt;

use super::*;
use chrono::{TimeZone, Utc};
use nix::sys::stat::Mode;
use nix::unistd::{Gid, Uid};

/// Name of the temp file a write goes through (bc_sys::userfile).
const TEMP: &str = ".authorized_keys.bcd-tmp";

// Generated with ssh-keygen for these tests; the private halves were thrown away.
const KEY_A: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFoI/vRJxuXKIFpm08wZNESqDqg4OFGJz5u4IOqvbE7K";
const KEY_B: &str = "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBPo6FMVwpVh4Ab6voHMuOAK1MSc+zSrHjLTzsFTWmBtsBbG1WRv+QX5JLcAjlodVh4mMoRn7XDviVEwWmm2AiuE=";
const NOW: i64 = 1_800_000_000_000;

struct Host {
    _tmp: tempfile::TempDir,
    root: HostRoot,
    uid: u32,
    gid: u32,
}

impl Host {
    /// A host root with user `ops`. As root the user gets a uid of its own, so chown is tested.
    fn new() -> Result<Self, std::io::Error> {
        let tmp = tempfile::tempdir()?;
        let (uid, gid) = if Uid::effective().is_root() {
            (4242, 4243)
        } else {
            (Uid::effective().as_raw(), Gid::effective().as_raw())
        };
        std::fs::create_dir_all(tmp.path().join("etc"))?;
        std::fs::write(
            tmp.path().join("etc/passwd"),
            format!("root:x:0:0:root:/root:/bin/bash\nops:x:{uid}:{gid}:Ops:/home/ops:/bin/bash\n"),
        )?;
        std::fs::create_dir_all(tmp.path().join("home/ops"))?;
        Ok(Self {
            root: HostRoot::new(tmp.path()),
            _tmp: tmp,
            uid,
            gid,
        })
    }
    fn ssh_dir(&self) -> PathBuf {
        self.root.path("/home/ops/.ssh")
    }
    fn file(&self) -> PathBuf {
        self.ssh_dir().join("authorized_keys")
    }
    fn read(&self) -> String {
        std::fs::read_to_string(self.file()).unwrap_or_default()
    }
    fn seed(&self, content: &str) -> std::io::Result<()> {
        std::fs::create_dir_all(self.ssh_dir())?;
        std::fs::write(self.file(), content)
    }
}

fn key(public_key: &str, comment: &str, expires_at_ms: Option<i64>) -> SshKey {
    SshKey {
        public_key: public_key.to_owned(),
        comment: comment.to_owned(),
        expires_at: expires_at_ms.and_then(|ms| Utc.timestamp_millis_opt(ms).single()),
    }
}

#[test]
fn user_lines_outside_the_block_are_kept_byte_for_byte() -> Result<(), Box<dyn std::error::Error>> {
    let h = Host::new()?;
    let user = "ssh-ed25519 AAAAuser laptop\n# a comment with trailing spaces   \r\n\ncommand=\"x\" ssh-rsa AAAA y\n";
    h.seed(user)?;
    let out = converge(&h.root, "ops", &[key(KEY_A, "oncall alice", None)], NOW)?;
    assert!(out.changed);
    assert_eq!(out.installed, 1);
    let text = h.read();
    assert_eq!(
        text,
        format!("{user}{BEGIN_MARKER}\n{KEY_A} oncall alice\n{END_MARKER}\n")
    );

    // The user adds a line after the block; a new key set replaces only the block.
    std::fs::write(h.file(), format!("{text}ssh-ed25519 AAAAafter later"))?;
    converge(&h.root, "ops", &[key(KEY_B, "bob", None)], NOW)?;
    assert_eq!(
        h.read(),
        format!("{user}{BEGIN_MARKER}\n{KEY_B} bob\n{END_MARKER}\nssh-ed25519 AAAAafter later")
    );

    // No keys: the block goes, everything else stays.
    converge(&h.root, "ops", &[], NOW)?;
    assert_eq!(h.read(), format!("{user}ssh-ed25519 AAAAafter later"));
    Ok(())
}

#[test]
fn a_last_line_without_newline_gets_one_before_the_block() -> Result<(), Box<dyn std::error::Error>>
{
    let h = Host::new()?;
    h.seed("ssh-ed25519 AAAAuser laptop")?;
    converge(&h.root, "ops", &[key(KEY_A, "", None)], NOW)?;
    assert!(h.read().starts_with(&format!(
        "ssh-ed25519 AAAAuser laptop\n{BEGIN_MARKER}\n{KEY_A}\n"
    )));
    Ok(())
}

#[test]
fn expiry_removes_exactly_the_expired_key() -> Result<(), Box<dyn std::error::Error>> {
    let h = Host::new()?;
    let keys = [
        key(KEY_A, "short", Some(NOW + 1_000)),
        key(KEY_B, "long", None),
    ];
    let out = converge(&h.root, "ops", &keys, NOW)?;
    assert_eq!(out.installed, 2);
    assert_eq!(out.next_expiry_ms, Some(NOW + 1_000));
    let out = converge(&h.root, "ops", &keys, NOW + 1_000)?;
    assert!(out.changed);
    assert_eq!(out.installed, 1);
    assert_eq!(out.next_expiry_ms, None);
    let text = h.read();
    assert!(!text.contains("short"), "{text}");
    assert!(text.contains(&format!("{KEY_B} long")), "{text}");
    // All expired: the block (and nothing else) is gone.
    let out = converge(&h.root, "ops", &[key(KEY_A, "short", Some(NOW))], NOW)?;
    assert_eq!(out.installed, 0);
    assert_eq!(h.read(), "");
    Ok(())
}

#[test]
fn wrong_permissions_and_owner_are_fixed_then_nothing_changes()
-> Result<(), Box<dyn std::error::Error>> {
    let h = Host::new()?;
    h.seed("")?;
    std::fs::set_permissions(
        h.ssh_dir(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )?;
    std::fs::set_permissions(
        h.file(),
        std::os::unix::fs::PermissionsExt::from_mode(0o666),
    )?;
    let keys = [key(KEY_A, "a", None)];
    assert!(converge(&h.root, "ops", &keys, NOW)?.changed);
    assert_eq!(owner_and_mode(&h.ssh_dir())?, (h.uid, h.gid, 0o700));
    assert_eq!(owner_and_mode(&h.file())?, (h.uid, h.gid, 0o600));

    // Same content, only the mode drifted: fixed in place.
    let inode = std::fs::metadata(h.file())?.ino();
    std::fs::set_permissions(
        h.file(),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )?;
    assert!(converge(&h.root, "ops", &keys, NOW)?.changed);
    assert_eq!(owner_and_mode(&h.file())?.2, 0o600);
    assert_eq!(std::fs::metadata(h.file())?.ino(), inode);

    // Converged: a second apply touches nothing.
    let out = converge(&h.root, "ops", &keys, NOW)?;
    assert!(!out.changed);
    assert_eq!(std::fs::metadata(h.file())?.ino(), inode);
    Ok(())
}

#[test]
fn a_fresh_user_gets_ssh_dir_and_file_with_right_modes() -> Result<(), Box<dyn std::error::Error>> {
    let h = Host::new()?;
    // Nothing to install: nothing is created.
    assert!(!converge(&h.root, "ops", &[], NOW)?.changed);
    assert!(!h.ssh_dir().exists());
    converge(&h.root, "ops", &[key(KEY_A, "a", None)], NOW)?;
    assert_eq!(owner_and_mode(&h.ssh_dir())?, (h.uid, h.gid, 0o700));
    assert_eq!(owner_and_mode(&h.file())?, (h.uid, h.gid, 0o600));
    assert!(!h.ssh_dir().join(TEMP).exists());
    Ok(())
}

#[test]
fn symlinked_file_or_dir_is_refused_and_its_target_untouched()
-> Result<(), Box<dyn std::error::Error>> {
    let h = Host::new()?;
    let target = h.root.path("/etc/shadow");
    std::fs::write(&target, "root:*:1::::::\n")?;
    std::fs::create_dir_all(h.ssh_dir())?;
    std::os::unix::fs::symlink(&target, h.file())?;
    let err = converge(&h.root, "ops", &[key(KEY_A, "a", None)], NOW).err();
    assert!(
        matches!(err, Some(SshError::File(UserFileError::Symlink(_)))),
        "{err:?}"
    );
    assert_eq!(err.map(|e| e.reason()), Some("AuthorizedKeysUnsafe"));
    assert_eq!(std::fs::read_to_string(&target)?, "root:*:1::::::\n");

    std::fs::remove_dir_all(h.ssh_dir())?;
    let elsewhere = h.root.path("/etc/ssh-elsewhere");
    std::fs::create_dir_all(&elsewhere)?;
    std::os::unix::fs::symlink(&elsewhere, h.ssh_dir())?;
    let err = converge(&h.root, "ops", &[key(KEY_A, "a", None)], NOW).err();
    assert!(
        matches!(err, Some(SshError::File(UserFileError::Symlink(_)))),
        "{err:?}"
    );
    assert_eq!(std::fs::read_dir(&elsewhere)?.count(), 0);
    Ok(())
}

#[test]
fn damaged_block_is_refused_untouched() -> Result<(), Box<dyn std::error::Error>> {
    let h = Host::new()?;
    for bad in [
        format!("{BEGIN_MARKER}\nssh-ed25519 AAAA x\n"),
        format!("{END_MARKER}\n"),
        format!("{BEGIN_MARKER}\n{END_MARKER}\n{BEGIN_MARKER}\n{END_MARKER}\n"),
    ] {
        h.seed(&bad)?;
        let err = converge(&h.root, "ops", &[key(KEY_A, "a", None)], NOW).err();
        assert!(
            matches!(err, Some(SshError::DamagedBlock { .. })),
            "{err:?}"
        );
        assert_eq!(h.read(), bad);
    }
    Ok(())
}

#[test]
fn unknown_user_and_missing_home_are_errors() -> Result<(), Box<dyn std::error::Error>> {
    let h = Host::new()?;
    let err = converge(&h.root, "nobody-here", &[key(KEY_A, "a", None)], NOW).err();
    assert_eq!(err.map(|e| e.reason()), Some("SshUserNotFound"));
    std::fs::remove_dir_all(h.root.path("/home/ops"))?;
    let err = converge(&h.root, "ops", &[key(KEY_A, "a", None)], NOW).err();
    assert!(matches!(err, Some(SshError::NoHome(_))), "{err:?}");
    Ok(())
}

proptest::proptest! {
    /// Whatever the user's file holds (short of our marker lines), installing a block and
    /// removing it again gives back the same bytes, and the block lands on its own lines.
    #[test]
    fn splice_round_trips_any_user_content(
        lines in proptest::collection::vec("[ -~\t\r]{0,40}", 0..8),
        trailing_newline in proptest::bool::ANY,
    ) {
        let mut user = lines.join("\n");
        if trailing_newline && !user.is_empty() {
            user.push('\n');
        }
        let path = Path::new("authorized_keys");
        let block = format!("{BEGIN_MARKER}\nssh-ed25519 AAAA k\n{END_MARKER}\n");
        let with = splice(user.as_bytes(), &block, path);
        proptest::prop_assert!(with.is_ok());
        let with = with.unwrap_or_default();
        let text = String::from_utf8_lossy(&with).into_owned();
        proptest::prop_assert!(text.starts_with(&user));
        proptest::prop_assert!(text.ends_with(&block));
        let begin_at = text.len() - block.len();
        proptest::prop_assert!(begin_at == 0 || text.as_bytes()[begin_at - 1] == b'\n');
        let without = splice(&with, "", path).unwrap_or_default();
        let mut want = user.clone().into_bytes();
        if !want.is_empty() && !want.ends_with(b"\n") {
            want.push(b'\n');
        }
        proptest::prop_assert_eq!(without, want);
        // Replacing the block with itself changes nothing.
        proptest::prop_assert_eq!(splice(&with, &block, path).unwrap_or_default(), with);
    }
}

/// Owner, group, mode and bytes of a file: what must not change in a root file a user points at.
fn fingerprint(p: &Path) -> std::io::Result<((u32, u32, u32), Vec<u8>)> {
    Ok((owner_and_mode(p)?, std::fs::read(p)?))
}

/// A stand-in for `/etc/shadow`: root's (when the test runs as root), 0640, secret bytes.
fn shadow(h: &Host) -> std::io::Result<PathBuf> {
    let p = h.root.path("/etc/shadow");
    std::fs::write(&p, "root:$6$secret-hash:19000::::::\n")?;
    std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o640))?;
    Ok(p)
}

#[test]
fn a_hard_linked_authorized_keys_is_refused_and_the_root_file_untouched()
-> Result<(), Box<dyn std::error::Error>> {
    let h = Host::new()?;
    let target = shadow(&h)?;
    std::fs::create_dir_all(h.ssh_dir())?;
    std::fs::hard_link(&target, h.file())?;
    let before = fingerprint(&target)?;
    // No key to install (the repro: shadow was chowned and chmodded to the user) and one key
    // (the repro: shadow's bytes were copied into the user's new file).
    for keys in [vec![], vec![key(KEY_A, "a", None)]] {
        let err = converge(&h.root, "ops", &keys, NOW).err();
        assert_eq!(
            err.as_ref().map(SshError::reason),
            Some("AuthorizedKeysUnsafe"),
            "{err:?}"
        );
        assert_eq!(fingerprint(&target)?, before, "the root file changed");
        // The user's name still points at the same inode: nothing new holds shadow's bytes.
        assert_eq!(
            std::fs::metadata(h.file())?.ino(),
            std::fs::metadata(&target)?.ino()
        );
        let leaked = std::fs::read_dir(h.ssh_dir())?
            .filter_map(Result::ok)
            .filter(|e| e.path() != h.file())
            .count();
        assert_eq!(leaked, 0, "a new file appeared in ~/.ssh");
    }
    Ok(())
}

#[test]
fn a_fifo_or_a_huge_sparse_authorized_keys_is_refused() -> Result<(), Box<dyn std::error::Error>> {
    let h = Host::new()?;
    std::fs::create_dir_all(h.ssh_dir())?;
    nix::unistd::mkfifo(&h.file(), Mode::from_bits_truncate(0o600))?;
    let err = converge(&h.root, "ops", &[key(KEY_A, "a", None)], NOW).err();
    assert_eq!(err.map(|e| e.reason()), Some("AuthorizedKeysUnsafe"));

    std::fs::remove_file(h.file())?;
    let f = File::create(h.file())?;
    f.set_len(2 << 30)?; // 2 GiB, all holes: refused from its size, never read.
    drop(f);
    let err = converge(&h.root, "ops", &[key(KEY_A, "a", None)], NOW).err();
    assert_eq!(
        err.as_ref().map(SshError::reason),
        Some("AuthorizedKeysUnsafe"),
        "{err:?}"
    );
    assert_eq!(std::fs::metadata(h.file())?.len(), 2 << 30);
    Ok(())
}

#[test]
fn a_home_symlink_planted_by_the_user_is_refused() -> Result<(), Box<dyn std::error::Error>> {
    let h = Host::new()?;
    // `/home` is writable by the user here, so `~` is a link the user could have made.
    let elsewhere = h.root.path("/etc/ssh-elsewhere");
    std::fs::create_dir_all(&elsewhere)?;
    std::fs::remove_dir_all(h.root.path("/home/ops"))?;
    std::fs::set_permissions(
        h.root.path("/home"),
        std::os::unix::fs::PermissionsExt::from_mode(0o1777),
    )?;
    std::os::unix::fs::symlink(&elsewhere, h.root.path("/home/ops"))?;
    let err = converge(&h.root, "ops", &[key(KEY_A, "a", None)], NOW).err();
    assert_eq!(
        err.as_ref().map(SshError::reason),
        Some("AuthorizedKeysUnsafe"),
        "{err:?}"
    );
    assert_eq!(std::fs::read_dir(&elsewhere)?.count(), 0);
    Ok(())
}
