//! Root's account and keys for the rescue: the keys checked, root's `/etc/passwd` entry made
//! when missing, and root's `~/.ssh/authorized_keys` written with the modes dropbear demands.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use bc_protocol::commands::rescue::MAX_RESCUE_KEYS;
use bcd_probes::hostroot::HostRoot;

use super::{RescueError, io};

/// The entry written to `/etc/passwd` when it names no root (`passwd(5)`): no password (`x`
/// with no shadow file matches none), home `/root`, shell busybox's `/bin/sh`.
pub const ROOT_PASSWD_LINE: &str = "root:x:0:0:root:/root:/bin/sh";

/// Each key parsed as `sshd`'s `authorized_keys` would take it, without options; the lines
/// trimmed.
pub fn check_keys(keys: &[String]) -> Result<Vec<String>, RescueError> {
    if keys.is_empty() || keys.len() > MAX_RESCUE_KEYS {
        return Err(RescueError::KeyCount(keys.len()));
    }
    keys.iter()
        .enumerate()
        .map(|(index, k)| {
            bc_protocol::spec::parse_public_key(k)
                .map(|_| k.trim().to_owned())
                .map_err(|why| RescueError::Key { index, why })
        })
        .collect()
}

/// Root's home from `<root>/etc/passwd`, after appending [`ROOT_PASSWD_LINE`] when no line
/// names root (or the file is missing).
pub fn ensure_root_account(root: &HostRoot) -> Result<String, RescueError> {
    let path = root.path("/etc/passwd");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(io(&path)(e)),
    };
    // passwd(5): name:password:UID:GID:GECOS:home:shell
    if let Some(home) = text.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() == 7 && f[0] == "root" && f[5].starts_with('/')).then(|| f[5].to_owned())
    }) {
        return Ok(home);
    }
    let dir = root.path("/etc");
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o644)
        .open(&path)
        .map_err(io(&path))?;
    let sep = if text.is_empty() || text.ends_with('\n') {
        ""
    } else {
        "\n"
    };
    writeln!(f, "{sep}{ROOT_PASSWD_LINE}").map_err(io(&path))?;
    Ok("/root".to_owned())
}

/// `<root><home>/.ssh/authorized_keys` holds `keys`, a line each, and nothing else: the home
/// and `.ssh` 0700, the file 0600 (replaced whole through a temporary file and a rename).
pub fn write_authorized_keys(
    root: &HostRoot,
    home: &str,
    keys: &[String],
) -> Result<(), RescueError> {
    let ssh = root.path(Path::new(home).join(".ssh"));
    for dir in [root.path(home), ssh.clone()] {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(io(&dir))?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).map_err(io(&dir))?;
    }
    let file = ssh.join("authorized_keys");
    let tmp = ssh.join("authorized_keys.new");
    let mut body = keys.join("\n");
    body.push('\n');
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io(&tmp))?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))
        .and_then(|()| f.write_all(body.as_bytes()))
        .and_then(|()| f.sync_all())
        .map_err(io(&tmp))?;
    std::fs::rename(&tmp, &file).map_err(io(&file))
}
