#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::os::unix::fs::PermissionsExt;

use super::*;

const KEY_A: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOERN77nva79CxNnrBtUHoVf+5B1uamEYVTUhLRKlKUW op@laptop";
const KEY_A_FP: &str = "SHA256:4sxD+j7yFT0/svVGwxHLkUfNW3HQ2kFdOK8GPAtlnvk";

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

#[test]
fn the_keys_are_roots_authorized_keys_only_readable_by_root() {
    let dir = tempfile::tempdir().unwrap();
    let root = HostRoot::new(dir.path());
    let home = ensure_root_account(&root).unwrap();
    assert_eq!(home, "/root");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("etc/passwd")).unwrap(),
        format!("{ROOT_PASSWD_LINE}\n")
    );
    let keys = check_keys(&[format!("  {KEY_A}  "), KEY_A.replace("op@laptop", "b")]).unwrap();
    write_authorized_keys(&root, &home, &keys).unwrap();
    let file = dir.path().join("root/.ssh/authorized_keys");
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        format!("{KEY_A}\n{}\n", KEY_A.replace("op@laptop", "b"))
    );
    assert_eq!(mode(&file), 0o600);
    assert_eq!(mode(&dir.path().join("root/.ssh")), 0o700);
    assert_eq!(mode(&dir.path().join("root")), 0o700);

    // A second start replaces the keys; a loose mode left behind is tightened.
    std::fs::set_permissions(
        dir.path().join("root/.ssh"),
        std::fs::Permissions::from_mode(0o777),
    )
    .unwrap();
    write_authorized_keys(&root, &home, &keys[..1]).unwrap();
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        format!("{KEY_A}\n")
    );
    assert_eq!(mode(&dir.path().join("root/.ssh")), 0o700);
    assert!(!dir.path().join("root/.ssh/authorized_keys.new").exists());
}

#[test]
fn an_existing_root_entry_is_kept_and_its_home_used() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("etc")).unwrap();
    let passwd = "daemon:x:1:1::/:/bin/false\nroot:x:0:0:root:/var/root:/bin/sh\n";
    std::fs::write(dir.path().join("etc/passwd"), passwd).unwrap();
    let root = HostRoot::new(dir.path());
    assert_eq!(ensure_root_account(&root).unwrap(), "/var/root");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("etc/passwd")).unwrap(),
        passwd
    );
    // No root line (and no final newline): root is appended on a line of its own.
    std::fs::write(dir.path().join("etc/passwd"), "daemon:x:1:1::/:/bin/false").unwrap();
    assert_eq!(ensure_root_account(&root).unwrap(), "/root");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("etc/passwd")).unwrap(),
        format!("daemon:x:1:1::/:/bin/false\n{ROOT_PASSWD_LINE}\n")
    );
}

#[test]
fn bad_keys_are_refused_by_index() {
    let e = check_keys(&[KEY_A.into(), "ssh-ed25519 AAAAC3Nza op@laptop".into()]).unwrap_err();
    assert!(matches!(e, RescueError::Key { index: 1, .. }), "{e}");
    let e = check_keys(&[format!("command=\"/bin/true\" {KEY_A}")]).unwrap_err();
    assert!(matches!(e, RescueError::Key { index: 0, .. }), "{e}");
    let e = check_keys(&[]).unwrap_err();
    assert!(matches!(e, RescueError::KeyCount(0)), "{e}");
}

#[test]
fn the_fingerprint_is_openssh_sha256_of_the_key_blob() {
    let out = format!("Public key portion is:\n{KEY_A}\nFingerprint: sha1!! 00:11\n");
    assert_eq!(fingerprint_of(&out).as_deref(), Some(KEY_A_FP));
    assert_eq!(fingerprint_of("Public key portion is:\n"), None);
}

#[test]
fn dropbear_runs_in_the_foreground_without_passwords() {
    let a = server_args(
        2222,
        &[PathBuf::from("/etc/dropbear/dropbear_ed25519_host_key")],
    );
    assert_eq!(
        a,
        [
            "-F",
            "-E",
            "-s",
            "-g",
            "-p",
            "2222",
            "-r",
            "/etc/dropbear/dropbear_ed25519_host_key"
        ]
    );
}

#[tokio::test]
async fn a_missing_dropbear_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let rescue = Rescue::new(RescueConfig {
        dropbear: dir.path().join("no-dropbear"),
        ..RescueConfig::default()
    });
    let e = rescue
        .start(&HostRoot::new(dir.path()), &[KEY_A.into()])
        .await
        .unwrap_err();
    assert!(e.to_string().contains("no-dropbear is missing"), "{e}");
}

/// A free TCP port on this host (bound, then released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("0.0.0.0:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The SSH identification line the server sends first (RFC 4253 §4.2).
fn banner(port: u16) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf).unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// The installed dropbear on a high port, against a temp root: it listens, presents the host
/// keys whose fingerprints the start reported, and a second start restarts it cleanly.
#[tokio::test]
async fn the_real_dropbear_starts_restarts_and_stops() {
    let cfg = RescueConfig {
        port: free_port(),
        ..RescueConfig::default()
    };
    if !cfg.dropbear.is_file() || !cfg.dropbearkey.is_file() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "dropbear-bin is not installed"
        );
        eprintln!("!!! SKIPPED: dropbear-bin is not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = HostRoot::new(dir.path());
    std::fs::create_dir_all(dir.path().join("run")).unwrap();
    let rescue = Rescue::new(cfg.clone());
    let r = rescue.start(&root, &[KEY_A.into()]).await.unwrap();
    assert_eq!((r.port, r.authorized_keys), (cfg.port, 1));
    assert_eq!(r.host_key_fingerprints.len(), HOST_KEY_TYPES.len(), "{r:?}");
    assert!(
        r.host_key_fingerprints
            .iter()
            .all(|f| f.starts_with("SHA256:") && f.len() == 50),
        "{r:?}"
    );
    assert!(r.addresses.is_empty(), "a temp root is not live: {r:?}");
    assert!(banner(cfg.port).starts_with("SSH-2.0-dropbear"));
    // dropbearkey's own fingerprint of the ed25519 key agrees with ours.
    let out = std::process::Command::new(&cfg.dropbearkey)
        .args(["-y", "-f"])
        .arg(dir.path().join("etc/dropbear/dropbear_ed25519_host_key"))
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&out.stdout);
    if let Some(theirs) = out
        .lines()
        .find_map(|l| l.strip_prefix("Fingerprint: SHA256:"))
    {
        assert_eq!(
            r.host_key_fingerprints[0],
            format!("SHA256:{}", theirs.trim())
        );
    }
    let first = rescue.server.lock().await.as_ref().unwrap().0.id();

    let again = rescue
        .start(&root, &[KEY_A.into(), KEY_A.replace("op@laptop", "b")])
        .await
        .unwrap();
    assert_eq!(
        again.host_key_fingerprints, r.host_key_fingerprints,
        "the host keys stay"
    );
    assert_eq!(again.authorized_keys, 2);
    let second = rescue.server.lock().await.as_ref().unwrap().0.id();
    assert_ne!(first, second, "restarted");
    assert!(
        !Path::new(&format!("/proc/{first}")).exists(),
        "the first server was reaped"
    );
    assert!(banner(cfg.port).starts_with("SSH-2.0-dropbear"));

    drop(rescue);
    assert!(
        !Path::new(&format!("/proc/{second}")).exists(),
        "stopped with the ramdisk"
    );
    // Nothing of dropbear's answers on its port any more. The port is free for anyone once it
    // exited, so a concurrent test's listener may have taken it: what counts is that no SSH
    // server speaks there.
    if let Ok(mut s) = TcpStream::connect(("127.0.0.1", cfg.port)) {
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut buf = [0u8; 64];
        let n = s.read(&mut buf).unwrap_or(0);
        let what = String::from_utf8_lossy(&buf[..n]);
        assert!(
            !what.starts_with("SSH-"),
            "an SSH server still answers on {} after the stop: {what:?}",
            cfg.port
        );
    }
    let log = std::fs::read_to_string(dir.path().join("run/dropbear.log")).unwrap();
    assert_eq!(
        log.matches("Not backgrounding").count(),
        2,
        "two starts, one log: {log}"
    );
}
