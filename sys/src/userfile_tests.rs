//! The rule against real files in temp dirs: hard links, symlinks, FIFOs, sparse files, foreign
//! owners. Tests that need another uid run as root (as they do in CI); outside CI they say so
//! loudly and skip when not root.

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use super::*;

const USER: Owner = Owner {
    uid: 4242,
    gid: 4243,
};

/// True when running as root; otherwise fails under `CI=true` and skips loudly elsewhere.
fn root_or_skip(test: &str) -> bool {
    if Uid::effective().is_root() {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{test} needs root (chown to another uid) and CI=true is set"
    );
    eprintln!("!!! {test}: SKIPPED, needs root (chown to another uid)");
    false
}

/// The owner a test's user gets: uid 4242 as root, the test's own uid otherwise.
fn user() -> Owner {
    if Uid::effective().is_root() {
        USER
    } else {
        Owner {
            uid: Uid::effective().as_raw(),
            gid: Gid::effective().as_raw(),
        }
    }
}

fn mode_of(p: &Path) -> std::io::Result<(u32, u32, u32)> {
    let m = std::fs::symlink_metadata(p)?;
    Ok((m.uid(), m.gid(), m.mode() & 0o7777))
}

/// `<tmp>/etc/shadow` (root-only stand-in) and `<tmp>/home/u` owned by the user.
struct Tree {
    tmp: tempfile::TempDir,
}

impl Tree {
    fn new() -> std::io::Result<Self> {
        let tmp = tempfile::tempdir()?;
        std::fs::create_dir_all(tmp.path().join("etc"))?;
        std::fs::write(tmp.path().join("etc/shadow"), "root:$6$secret:1::::::\n")?;
        std::fs::set_permissions(
            tmp.path().join("etc/shadow"),
            std::fs::Permissions::from_mode(0o640),
        )?;
        std::fs::create_dir_all(tmp.path().join("home/u"))?;
        let t = Self { tmp };
        t.chown(&t.home(), user())?;
        Ok(t)
    }
    fn home(&self) -> PathBuf {
        self.tmp.path().join("home/u")
    }
    fn shadow(&self) -> PathBuf {
        self.tmp.path().join("etc/shadow")
    }
    fn chown(&self, p: &Path, o: Owner) -> std::io::Result<()> {
        if Uid::effective().is_root() {
            std::os::unix::fs::lchown(p, Some(o.uid), Some(o.gid))?;
        }
        Ok(())
    }
    fn dir(&self) -> Result<UserDir, Box<dyn std::error::Error>> {
        Ok(UserDir::open(&self.home(), user())?.ok_or("home missing")?)
    }
}

#[test]
fn a_hard_link_to_a_root_file_is_refused_and_the_file_untouched()
-> Result<(), Box<dyn std::error::Error>> {
    let t = Tree::new()?;
    std::fs::hard_link(t.shadow(), t.home().join("keys"))?;
    let before = (mode_of(&t.shadow())?, std::fs::read(t.shadow())?);
    let err = t.dir()?.read("keys", 1 << 20).err();
    assert!(
        matches!(err, Some(UserFileError::HardLinked { links: 2, .. })),
        "{err:?}"
    );
    assert!(err.is_some_and(|e| e.is_unsafe()));
    // Replacing the name (what a write does) leaves the other name's inode alone.
    t.dir()?.replace("keys", b"new\n", 0o600)?;
    assert_eq!((mode_of(&t.shadow())?, std::fs::read(t.shadow())?), before);
    assert_eq!(std::fs::read(t.home().join("keys"))?, b"new\n");
    assert_eq!(
        mode_of(&t.home().join("keys"))?,
        (user().uid, user().gid, 0o600)
    );
    Ok(())
}

#[test]
fn symlinked_files_and_subdirs_are_refused() -> Result<(), Box<dyn std::error::Error>> {
    let t = Tree::new()?;
    std::os::unix::fs::symlink(t.shadow(), t.home().join("keys"))?;
    std::os::unix::fs::symlink(t.tmp.path().join("etc"), t.home().join(".ssh"))?;
    let dir = t.dir()?;
    let err = dir.read("keys", 1 << 20).err();
    assert!(matches!(err, Some(UserFileError::Symlink(_))), "{err:?}");
    let err = dir.subdir(".ssh").err();
    assert!(matches!(err, Some(UserFileError::Symlink(_))), "{err:?}");
    let err = dir.create_subdir(".ssh", 0o700).err();
    assert!(matches!(err, Some(UserFileError::Symlink(_))), "{err:?}");
    assert_eq!(std::fs::read(t.shadow())?, b"root:$6$secret:1::::::\n");
    Ok(())
}

#[test]
fn a_fifo_is_refused_without_blocking() -> Result<(), Box<dyn std::error::Error>> {
    let t = Tree::new()?;
    nix::unistd::mkfifo(&t.home().join("keys"), Mode::from_bits_truncate(0o600))?;
    let err = t.dir()?.read("keys", 1 << 20).err();
    assert!(
        matches!(
            err,
            Some(UserFileError::WrongType {
                found: "a FIFO",
                ..
            })
        ),
        "{err:?}"
    );
    Ok(())
}

#[test]
fn a_huge_sparse_file_is_refused_from_its_size_not_read() -> Result<(), Box<dyn std::error::Error>>
{
    let t = Tree::new()?;
    let f = File::create(t.home().join("keys"))?;
    f.set_len(2 << 30)?; // 2 GiB of holes: no disk used, and must not be read into memory.
    drop(f);
    t.chown(&t.home().join("keys"), user())?;
    let err = t.dir()?.read("keys", 1 << 20).err();
    assert!(
        matches!(err, Some(UserFileError::TooLarge { size, limit: 1_048_576, .. }) if size == 2 << 30),
        "{err:?}"
    );
    // Within the limit: read whole.
    std::fs::write(t.home().join("small"), b"ok\n")?;
    let small = t.dir()?.read("small", 3)?.ok_or("missing")?;
    assert_eq!(small.bytes, b"ok\n");
    assert!(t.dir()?.read("absent", 3)?.is_none());
    Ok(())
}

#[test]
fn a_file_or_dir_of_another_user_is_refused() -> Result<(), Box<dyn std::error::Error>> {
    if !root_or_skip("a_file_or_dir_of_another_user_is_refused") {
        return Ok(());
    }
    let t = Tree::new()?;
    let other = Owner {
        uid: 5151,
        gid: 5151,
    };
    std::fs::write(t.home().join("keys"), b"x\n")?;
    t.chown(&t.home().join("keys"), other)?;
    let err = t.dir()?.read("keys", 10).err();
    assert!(
        matches!(err, Some(UserFileError::ForeignOwner { uid: 5151, .. })),
        "{err:?}"
    );
    std::fs::create_dir(t.home().join(".ssh"))?;
    t.chown(&t.home().join(".ssh"), other)?;
    let err = t.dir()?.subdir(".ssh").err();
    assert!(
        matches!(err, Some(UserFileError::ForeignOwner { .. })),
        "{err:?}"
    );
    t.chown(&t.home(), other)?;
    let err = UserDir::open(&t.home(), USER).err();
    assert!(
        matches!(err, Some(UserFileError::ForeignOwner { .. })),
        "{err:?}"
    );
    // Root's files are the user's to have: a root-owned file with one link is fine.
    t.chown(&t.home(), USER)?;
    std::fs::write(t.home().join("rootfile"), b"r\n")?;
    t.chown(&t.home().join("rootfile"), Owner { uid: 0, gid: 0 })?;
    let f = t.dir()?.read("rootfile", 10)?.ok_or("missing")?;
    assert!(f.set_owner_mode(0o600)?);
    assert_eq!(mode_of(&t.home().join("rootfile"))?, (4242, 4243, 0o600));
    Ok(())
}

#[test]
fn only_symlinks_made_by_root_are_followed_on_the_way_to_a_home()
-> Result<(), Box<dyn std::error::Error>> {
    if !root_or_skip("only_symlinks_made_by_root_are_followed_on_the_way_to_a_home") {
        return Ok(());
    }
    let t = Tree::new()?;
    let base = t.tmp.path();
    // `/data/home/u` reached through `/homes -> data/home`, a link in a root-only directory.
    std::fs::create_dir_all(base.join("data/home/u2"))?;
    std::os::unix::fs::symlink("data/home", base.join("homes"))?;
    std::fs::set_permissions(base, std::fs::Permissions::from_mode(0o755))?;
    let d = UserDir::open(&base.join("homes/u2"), USER)?.ok_or("missing")?;
    assert_eq!(d.path(), base.join("homes/u2"));

    // The same link in a directory the user can write: refused.
    std::fs::create_dir_all(base.join("shared"))?;
    std::fs::set_permissions(base.join("shared"), std::fs::Permissions::from_mode(0o1777))?;
    std::os::unix::fs::symlink(base.join("etc"), base.join("shared/u"))?;
    let err = UserDir::open(&base.join("shared/u"), USER).err();
    assert!(matches!(err, Some(UserFileError::Symlink(_))), "{err:?}");
    // And in a directory the user owns.
    std::os::unix::fs::symlink(base.join("etc"), t.home().join("sub"))?;
    let err = UserDir::open(&t.home().join("sub"), USER).err();
    assert!(matches!(err, Some(UserFileError::Symlink(_))), "{err:?}");
    // Missing: None; a file on the way: WrongType.
    assert!(UserDir::open(&base.join("nope/u"), USER)?.is_none());
    let err = UserDir::open(&base.join("etc/shadow/x"), USER).err();
    assert!(
        matches!(err, Some(UserFileError::WrongType { .. })),
        "{err:?}"
    );
    Ok(())
}

#[test]
fn replace_and_create_subdir_give_the_user_ownership() -> Result<(), Box<dyn std::error::Error>> {
    let t = Tree::new()?;
    let dir = t.dir()?;
    let ssh = dir.create_subdir(".ssh", 0o700)?;
    assert_eq!(
        mode_of(&t.home().join(".ssh"))?,
        (user().uid, user().gid, 0o700)
    );
    assert!(!ssh.set_owner_mode(0o700)?);
    ssh.replace("authorized_keys", b"k\n", 0o600)?;
    let p = t.home().join(".ssh/authorized_keys");
    assert_eq!(mode_of(&p)?, (user().uid, user().gid, 0o600));
    let f = ssh.read("authorized_keys", 10)?.ok_or("missing")?;
    assert_eq!(f.bytes, b"k\n");
    assert!(!f.set_owner_mode(0o600)?);
    assert!(!t.home().join(".ssh/.authorized_keys.bcd-tmp").exists());
    // A leftover (or planted) temp name is replaced, not written through.
    std::fs::hard_link(t.shadow(), t.home().join(".ssh/.authorized_keys.bcd-tmp"))?;
    ssh.replace("authorized_keys", b"k2\n", 0o600)?;
    assert_eq!(std::fs::read(&p)?, b"k2\n");
    assert_eq!(std::fs::read(t.shadow())?, b"root:$6$secret:1::::::\n");
    assert!(ssh.read("../x", 10).is_err());
    Ok(())
}
