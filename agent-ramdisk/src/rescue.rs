//! `rescue.start {sshKeys}`: an SSH server (dropbear, in the image) that accepts only the given
//! keys, as root, for an operator to repair a deployed machine's disk from the ramdisk.
//!
//! One start: the keys are checked (`bc_protocol::spec::parse_public_key`: no options, no DSA,
//! no short RSA); root's entry in `/etc/passwd` is made if missing (dropbear needs one, and a
//! shell); the keys become root's `~/.ssh/authorized_keys` (home and `.ssh` 0700, the file 0600:
//! dropbear refuses keys in a file or directory others can write, `dropbear(8)` "Authorized
//! Keys"); the host keys are made once per boot with `dropbearkey -t ed25519|ecdsa` in
//! `/etc/dropbear`; a server this ramdisk started before is stopped; then `dropbear -F -E -s -g
//! -p PORT -r KEY…` runs in the background (`-F`: not forked, so it stays this process's child
//! and a restart stops exactly it; `-s -g`: no password logins, root's included; `-E`: its log to
//! `/run/dropbear.log`), and the start returns once `127.0.0.1:PORT` accepts a connection.
//!
//! Host key fingerprints are OpenSSH's (`ssh-keygen -l`): `SHA256:` and the unpadded base64 of
//! the SHA-256 of the key blob, computed from `dropbearkey -y`'s public key line.

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bc_protocol::commands::rescue::{MAX_RESCUE_KEYS, RescueResult};
use bcd_probes::hostroot::HostRoot;
use tokio::sync::Mutex;

mod keys;

pub use keys::{ROOT_PASSWD_LINE, check_keys, ensure_root_account, write_authorized_keys};

/// The host key types made, with `dropbearkey -t`'s names; files are
/// `/etc/dropbear/dropbear_<type>_host_key`, dropbear's default names.
pub const HOST_KEY_TYPES: [&str; 2] = ["ed25519", "ecdsa"];

/// How often the start tries to connect while the server comes up.
const POLL: Duration = Duration::from_millis(50);

/// Where the rescue's programs are and how it listens.
#[derive(Debug, Clone)]
pub struct RescueConfig {
    /// The SSH server (`/usr/sbin/dropbear`, package dropbear-bin).
    pub dropbear: PathBuf,
    /// Its key generator (`/usr/bin/dropbearkey`, the same package).
    pub dropbearkey: PathBuf,
    /// The TCP port it listens on, on every address (22).
    pub port: u16,
    /// How long the server may take to accept a connection after it starts (10 s).
    pub listen_timeout: Duration,
}

impl Default for RescueConfig {
    fn default() -> Self {
        Self {
            dropbear: PathBuf::from("/usr/sbin/dropbear"),
            dropbearkey: PathBuf::from("/usr/bin/dropbearkey"),
            port: 22,
            listen_timeout: Duration::from_secs(10),
        }
    }
}

/// Why a rescue could not start (the command's `RESCUE_FAILED` message).
#[derive(Debug, thiserror::Error)]
pub enum RescueError {
    /// A key is unusable.
    #[error("sshKeys[{index}]: {why}")]
    Key {
        /// Its index in `sshKeys`.
        index: usize,
        /// Why, as a sentence.
        why: String,
    },
    /// No keys, or too many.
    #[error("{0} keys: 1 to {MAX_RESCUE_KEYS} needed")]
    KeyCount(usize),
    /// A program is not where the configuration says.
    #[error("{} is missing (is dropbear-bin in the image?)", .0.display())]
    Missing(PathBuf),
    /// A file or directory could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A program ran and failed.
    #[error("{what} failed: {why}")]
    Tool {
        /// The command line, short.
        what: String,
        /// Its exit status and output, or why it could not run.
        why: String,
    },
    /// The server exited, or did not accept a connection in time.
    #[error("the SSH server is not listening on port {port}: {why}")]
    NotListening {
        /// Its port.
        port: u16,
        /// What happened, with its log's last lines.
        why: String,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> RescueError + '_ {
    move |source| RescueError::Io {
        path: path.to_owned(),
        source,
    }
}

/// The rescue server of this boot: its settings and the dropbear it started, if any. Dropping it
/// stops that server.
#[derive(Debug, Clone)]
pub struct Rescue {
    /// Where the programs are.
    pub config: RescueConfig,
    server: Arc<Mutex<Option<Server>>>,
}

impl Rescue {
    /// No server running yet.
    pub fn new(config: RescueConfig) -> Self {
        Self {
            config,
            server: Arc::default(),
        }
    }

    /// `rescue.start`: see the module docs. A second start replaces the keys and restarts the
    /// server (the host keys stay); sessions already open are not cut.
    pub async fn start(
        &self,
        root: &HostRoot,
        keys: &[String],
    ) -> Result<RescueResult, RescueError> {
        let mut guard = Arc::clone(&self.server).lock_owned().await;
        let (cfg, root, keys) = (self.config.clone(), root.clone(), keys.to_vec());
        tokio::task::spawn_blocking(move || start(&cfg, &root, &keys, &mut guard))
            .await
            .map_err(|e| RescueError::Tool {
                what: "rescue.start".into(),
                why: e.to_string(),
            })?
    }
}

/// A dropbear this ramdisk started; stopped (and reaped) on drop.
#[derive(Debug)]
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(
    cfg: &RescueConfig,
    root: &HostRoot,
    keys: &[String],
    running: &mut Option<Server>,
) -> Result<RescueResult, RescueError> {
    let keys = check_keys(keys)?;
    for tool in [&cfg.dropbear, &cfg.dropbearkey] {
        if !tool.is_file() {
            return Err(RescueError::Missing(tool.clone()));
        }
    }
    let home = ensure_root_account(root)?;
    write_authorized_keys(root, &home, &keys)?;
    let mut host_keys = Vec::new();
    let mut fingerprints = Vec::new();
    for t in HOST_KEY_TYPES {
        let (path, fingerprint) = host_key(cfg, root, t)?;
        host_keys.push(path);
        fingerprints.push(fingerprint);
    }
    // The old server first: connecting to it would pass for the new one listening.
    *running = None;
    let run_dir = root.path("/run");
    std::fs::create_dir_all(&run_dir).map_err(io(&run_dir))?;
    let log_path = run_dir.join("dropbear.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(io(&log_path))?;
    let err = log.try_clone().map_err(io(&log_path))?;
    let child = Command::new(&cfg.dropbear)
        .args(server_args(cfg.port, &host_keys))
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err)
        .spawn()
        .map_err(|e| RescueError::Tool {
            what: cfg.dropbear.display().to_string(),
            why: e.to_string(),
        })?;
    let mut server = Server(child);
    wait_listening(&mut server.0, cfg, &log_path)?;
    tracing::info!(
        port = cfg.port,
        keys = keys.len(),
        pid = server.0.id(),
        "rescue: dropbear listening"
    );
    *running = Some(server);
    Ok(RescueResult {
        port: cfg.port,
        host_key_fingerprints: fingerprints,
        addresses: addresses(root),
        authorized_keys: u32::try_from(keys.len()).unwrap_or(u32::MAX),
    })
}

/// dropbear's arguments (`dropbear(8)`): foreground (`-F`), log to stderr (`-E`), no password
/// logins (`-s`, and `-g` for root), `-p PORT` on every address, `-r` per host key.
pub fn server_args(port: u16, host_keys: &[PathBuf]) -> Vec<String> {
    let mut a: Vec<String> = ["-F", "-E", "-s", "-g", "-p"].map(str::to_owned).into();
    a.push(port.to_string());
    for k in host_keys {
        a.push("-r".into());
        a.push(k.display().to_string());
    }
    a
}

/// The host key of type `t` (made if missing) and its OpenSSH SHA-256 fingerprint.
fn host_key(
    cfg: &RescueConfig,
    root: &HostRoot,
    t: &str,
) -> Result<(PathBuf, String), RescueError> {
    let dir = root.path("/etc/dropbear");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(io(&dir))?;
    let path = dir.join(format!("dropbear_{t}_host_key"));
    if !path.exists() {
        run(&cfg.dropbearkey, &["-t", t, "-f"], &path)?;
    }
    let out = run(&cfg.dropbearkey, &["-y", "-f"], &path)?;
    let fingerprint = fingerprint_of(&out).ok_or_else(|| RescueError::Tool {
        what: format!("dropbearkey -y -f {}", path.display()),
        why: format!("no public key line in its output: {out:?}"),
    })?;
    Ok((path, fingerprint))
}

/// Runs `tool args… file` and gives its stdout.
fn run(tool: &Path, args: &[&str], file: &Path) -> Result<String, RescueError> {
    let what = format!("{} {} {}", tool.display(), args.join(" "), file.display());
    let out = Command::new(tool)
        .args(args)
        .arg(file)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| RescueError::Tool {
            what: what.clone(),
            why: e.to_string(),
        })?;
    if !out.status.success() {
        let why = format!(
            "{}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        return Err(RescueError::Tool { what, why });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The OpenSSH SHA-256 fingerprint (`SHA256:<unpadded base64>`, as `ssh-keygen -l` prints it)
/// of the first public key line (`<type> <base64> [comment]`) in `text`.
pub fn fingerprint_of(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let key = ssh_key::PublicKey::from_openssh(l.trim()).ok()?;
        Some(key.fingerprint(ssh_key::HashAlg::Sha256).to_string())
    })
}

/// Until `127.0.0.1:<port>` accepts a connection; the server's exit or the timeout is an error
/// with the log's last lines.
fn wait_listening(child: &mut Child, cfg: &RescueConfig, log: &Path) -> Result<(), RescueError> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, cfg.port));
    let started = Instant::now();
    let tail = || {
        let t = std::fs::read_to_string(log).unwrap_or_default();
        let lines: Vec<&str> = t.lines().collect();
        lines[lines.len().saturating_sub(5)..].join(" | ")
    };
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let why = format!("dropbear exited ({status}); its log: {}", tail());
            return Err(RescueError::NotListening {
                port: cfg.port,
                why,
            });
        }
        if TcpStream::connect_timeout(&addr, POLL).is_ok() {
            return Ok(());
        }
        if started.elapsed() > cfg.listen_timeout {
            let why = format!(
                "no connection in {:?}; its log: {}",
                cfg.listen_timeout,
                tail()
            );
            return Err(RescueError::NotListening {
                port: cfg.port,
                why,
            });
        }
        std::thread::sleep(POLL);
    }
}

/// The ramdisk's IPv4 addresses with their prefix, loopback left out, by interface name.
fn addresses(root: &HostRoot) -> Vec<String> {
    let mut by_iface: Vec<_> = bcd_probes::inventory::addrs::read(root)
        .ipv4
        .into_iter()
        .collect();
    by_iface.sort();
    by_iface
        .into_iter()
        .filter(|(iface, _)| iface != "lo")
        .flat_map(|(_, a)| a)
        .filter(|a| !a.starts_with("127."))
        .collect()
}

#[cfg(test)]
#[path = "rescue_tests.rs"]
mod tests;
