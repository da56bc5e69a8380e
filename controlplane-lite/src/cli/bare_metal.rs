//! The bare-metal node subcommands (`bcctl nodes enroll`, `inspect`, `deploy`, `rescue`,
//! `power`, `boot-device`, `update-bmc-credentials`, ...), the requests they send, and the
//! `sites get` table. A BMC password is never taken on the command line (it would sit in the
//! shell's history and in every process listing): it comes from `--password-file` or, with
//! `--password-stdin`, from standard input (a prompt without echo on a terminal).

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use bc_protocol::commands::bmc::{BootDevice, PowerAction};
use bc_protocol::commands::deploy::{
    Compression, ConfigDrive, ImageFormat, ImageSource, RootDeviceHints,
};
use clap::{Args, Subcommand, ValueEnum};
use cpl_core::text::{Id, Name};
use cpl_core::verbs::{
    BmcInput, BootDeviceRequest, DeployRequest, EnrollRequest, InspectRequest, PowerRequest,
    Request, RescueRequest, Secret, TlsMode, UnrescueRequest, UpdateBmcCredentialsRequest,
};
use serde_json::Value;

use super::call::{Call, items, spelled};
use super::render;

/// Where the BMC password comes from: one of the two, never the command line.
#[derive(Debug, Clone, Args)]
#[group(required = true, multiple = false)]
pub struct PasswordSource {
    /// A file holding the password (its first line; a trailing newline is not part of it).
    #[arg(long)]
    pub password_file: Option<PathBuf>,
    /// Read the password from standard input (prompted for, without echo, on a terminal).
    #[arg(long)]
    pub password_stdin: bool,
}

/// `nodes.power`'s actions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PowerVerb {
    /// Power on.
    On,
    /// Power off at once.
    Off,
    /// Restart at once.
    Reboot,
    /// Ask the OS to shut down.
    #[value(name = "softOff", alias = "soft-off")]
    SoftOff,
}

impl From<PowerVerb> for PowerAction {
    fn from(v: PowerVerb) -> Self {
        match v {
            PowerVerb::On => PowerAction::On,
            PowerVerb::Off => PowerAction::Off,
            PowerVerb::Reboot => PowerAction::Reboot,
            PowerVerb::SoftOff => PowerAction::SoftOff,
        }
    }
}

/// `nodes.setBootDevice`'s devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BootVerb {
    /// The network (PXE).
    Pxe,
    /// The local disk.
    Disk,
    /// No override: the firmware's own boot order.
    None,
}

impl From<BootVerb> for BootDevice {
    fn from(v: BootVerb) -> Self {
        match v {
            BootVerb::Pxe => BootDevice::Pxe,
            BootVerb::Disk => BootDevice::Disk,
            BootVerb::None => BootDevice::None,
        }
    }
}

/// The bare-metal node subcommands (flattened into `bcctl nodes`).
#[derive(Debug, Clone, Subcommand)]
pub enum BareMetalCommand {
    /// Enroll a machine through its BMC: the site's lease holder verifies the address and
    /// credentials; the node is `enrolling` until it did, `failed` (in maintenance) if not.
    /// Then, unless --no-inspect, the machine boots the ramdisk and is inspected and
    /// commissioned: `inspecting -> commissioning -> ready`.
    Enroll {
        /// The site whose site agent (bcd site) reaches the BMC.
        #[arg(long)]
        site: String,
        /// The pool the machine will serve.
        #[arg(long)]
        pool: Option<String>,
        /// A name for the machine.
        #[arg(long)]
        name: Option<String>,
        /// `redfish+https://host[:port][/redfish/v1/Systems/<id>]`, `redfish+http://…` or
        /// `ipmi://host[:port]`.
        #[arg(long)]
        bmc_address: String,
        #[arg(long)]
        username: String,
        #[command(flatten)]
        password: PasswordSource,
        /// How the site agent checks the BMC's certificate: pin (trust on first use), verify
        /// (the site agent's system roots), insecure (no check).
        #[arg(long, default_value = "pin", value_parser = spelled::<TlsMode>(["pin", "verify", "insecure"]))]
        tls: TlsMode,
        /// A NIC MAC of the machine; repeatable.
        #[arg(long = "mac")]
        macs: Vec<String>,
        /// Stop at `enrolling` once the BMC is verified (inspect later with `nodes inspect`).
        #[arg(long)]
        no_inspect: bool,
        /// The machine already runs the OS it keeps (Metal3's externallyProvisioned): once the
        /// BMC is verified it is `deployed`, with no network boot and no inspection.
        #[arg(long, conflicts_with = "no_inspect")]
        deployed: bool,
    },
    /// Deploy an image onto a ready machine: it boots the ramdisk, which streams the image onto
    /// the root disk while hashing it and writes a cloud-init config drive; then it boots from
    /// its disk → `deployed`.
    Deploy {
        node_id: String,
        #[command(flatten)]
        deploy: Box<DeployArgs>,
        #[arg(long)]
        version: Option<u64>,
    },
    /// Rescue a deployed machine: it boots the ramdisk, whose SSH server accepts only the given
    /// keys (the node's `Rescued` condition says where).
    Rescue {
        node_id: String,
        /// An OpenSSH public key the rescue accepts; repeatable, at least one.
        #[arg(long = "ssh-key", required = true)]
        ssh_keys: Vec<String>,
        #[arg(long)]
        version: Option<u64>,
    },
    /// End a rescue: the machine reboots from its disk → `deployed`.
    Unrescue {
        node_id: String,
        #[arg(long)]
        version: Option<u64>,
    },
    /// Release a deployed machine: its identity ends, it boots the ramdisk, every disk is
    /// cleaned (the pool's `--cleaning`) and commissioning checks it again → `ready`.
    Release {
        node_id: String,
        #[arg(long)]
        version: Option<u64>,
    },
    /// Inspect a bare-metal machine (again): it boots the ramdisk with a one-time boot token,
    /// is checked against its BMC's identifiers and commissioned back to `ready`.
    Inspect {
        node_id: String,
        #[arg(long)]
        version: Option<u64>,
    },
    /// Power a bare-metal node: on, off, reboot or softOff (a bmc.power command).
    Power {
        node_id: String,
        #[arg(value_enum)]
        action: PowerVerb,
        #[arg(long)]
        version: Option<u64>,
    },
    /// Set the device the node boots from next: pxe or disk (every boot with --persistent).
    BootDevice {
        node_id: String,
        #[arg(value_enum)]
        device: BootVerb,
        #[arg(long)]
        persistent: bool,
        #[arg(long)]
        version: Option<u64>,
    },
    /// Rotate the node's BMC credentials: kept only once the BMC accepted them.
    UpdateBmcCredentials {
        node_id: String,
        #[arg(long)]
        username: String,
        #[command(flatten)]
        password: PasswordSource,
        #[arg(long)]
        version: Option<u64>,
    },
}

/// `nodes deploy`'s image, root-device hints and config drive.
#[derive(Debug, Clone, clap::Args)]
pub struct DeployArgs {
    /// The image's http:// or https:// URL.
    #[arg(long)]
    pub image_url: String,
    /// The SHA-256 of the file as served (64 lowercase hex digits).
    #[arg(long)]
    pub image_sha256: String,
    /// How the image file is laid out.
    #[arg(long, default_value = "raw", value_parser = spelled::<ImageFormat>(["raw", "qcow2"]))]
    pub image_format: ImageFormat,
    /// How the image file is compressed on the server.
    #[arg(long, default_value = "none", value_parser = spelled::<Compression>(["none", "gzip", "zstd"]))]
    pub image_compression: Compression,
    /// Root-device hint: the disk's serial.
    #[arg(long)]
    pub root_serial: Option<String>,
    /// Root-device hint: the disk's WWN.
    #[arg(long)]
    pub root_wwn: Option<String>,
    /// Root-device hint: the kernel name or a /dev/disk/by-* name.
    #[arg(long)]
    pub root_name: Option<String>,
    /// Root-device hint: at least this many bytes.
    #[arg(long)]
    pub root_min_size: Option<u64>,
    /// The config drive's hostname (a config drive is written when given).
    #[arg(long)]
    pub hostname: Option<String>,
    /// An OpenSSH public key for the config drive; repeatable.
    #[arg(long = "ssh-key")]
    pub ssh_keys: Vec<String>,
    /// A file whose content is the config drive's user-data.
    #[arg(long)]
    pub user_data_file: Option<PathBuf>,
}

impl DeployArgs {
    /// The `nodes.deploy` request for `node_id` at `version`.
    fn request(&self, node_id: Id, version: u64) -> anyhow::Result<DeployRequest> {
        let hints = [
            self.root_serial.is_some(),
            self.root_wwn.is_some(),
            self.root_name.is_some(),
            self.root_min_size.is_some(),
        ];
        let root_device = hints.iter().any(|h| *h).then(|| RootDeviceHints {
            serial: self.root_serial.clone(),
            wwn: self.root_wwn.clone(),
            name: self.root_name.clone(),
            min_size_bytes: self.root_min_size,
        });
        let user_data = match &self.user_data_file {
            Some(p) => Some(
                std::fs::read_to_string(p)
                    .map_err(|e| anyhow::anyhow!("reading {}: {e}", p.display()))?,
            ),
            None => None,
        };
        if self.hostname.is_none() && (!self.ssh_keys.is_empty() || user_data.is_some()) {
            bail!("--ssh-key and --user-data-file go on the config drive: give --hostname too");
        }
        let config_drive = self.hostname.as_ref().map(|h| ConfigDrive {
            hostname: h.clone(),
            ssh_keys: self.ssh_keys.clone(),
            user_data,
        });
        Ok(DeployRequest {
            node_id,
            version: Some(version),
            image: ImageSource {
                url: self.image_url.clone(),
                sha256: self.image_sha256.clone(),
                format: self.image_format,
                compression: self.image_compression,
            },
            root_device,
            config_drive,
        })
    }
}

/// What a bare-metal node subcommand sends. Reads the BMC password (`enroll`,
/// `update-bmc-credentials`) and the user-data file (`deploy`) now.
pub(crate) fn call(cmd: BareMetalCommand) -> anyhow::Result<Call> {
    use BareMetalCommand as B;
    Ok(match cmd {
        B::Enroll {
            site,
            pool,
            name,
            bmc_address,
            username,
            password,
            tls,
            macs,
            no_inspect,
            deployed,
        } => Call::once(Request::NodesEnroll(EnrollRequest {
            site_id: Id::unchecked(site),
            pool_id: pool.map(Id::unchecked),
            name: name.map(Name::unchecked),
            bmc: BmcInput {
                address: bmc_address,
                username,
                password: Secret::from(read_password(&password)?),
                tls,
            },
            macs: (!macs.is_empty()).then_some(macs),
            inspect: !no_inspect,
            deployed,
        })),
        B::Inspect { node_id, version } => Call::mutation(node_id, version, |node_id, version| {
            Request::NodesInspect(InspectRequest {
                node_id,
                version: Some(version),
            })
        }),
        B::Deploy {
            node_id,
            deploy,
            version,
        } => {
            // Built once now, so a missing --hostname or an unreadable file fails before
            // anything is sent.
            let first = deploy.request(Id::unchecked(node_id.as_str()), 0)?;
            Call::mutation(node_id, version, move |node_id, version| {
                Request::NodesDeploy(DeployRequest {
                    node_id,
                    version: Some(version),
                    ..first.clone()
                })
            })
        }
        B::Rescue {
            node_id,
            ssh_keys,
            version,
        } => Call::mutation(node_id, version, move |node_id, version| {
            Request::NodesRescue(RescueRequest {
                node_id,
                version: Some(version),
                ssh_keys: ssh_keys.clone(),
            })
        }),
        B::Unrescue { node_id, version } => Call::mutation(node_id, version, |node_id, version| {
            Request::NodesUnrescue(UnrescueRequest {
                node_id,
                version: Some(version),
            })
        }),
        B::Release { node_id, version } => Call::node_verb(node_id, version, Request::NodesRelease),
        B::Power {
            node_id,
            action,
            version,
        } => Call::mutation(node_id, version, move |node_id, version| {
            Request::NodesPower(PowerRequest {
                node_id,
                version: Some(version),
                action: action.into(),
            })
        }),
        B::BootDevice {
            node_id,
            device,
            persistent,
            version,
        } => Call::mutation(node_id, version, move |node_id, version| {
            Request::NodesSetBootDevice(BootDeviceRequest {
                node_id,
                version: Some(version),
                device: device.into(),
                persistent,
            })
        }),
        B::UpdateBmcCredentials {
            node_id,
            username,
            password,
            version,
        } => {
            let password = Secret::from(read_password(&password)?);
            Call::mutation(node_id, version, move |node_id, version| {
                Request::NodesUpdateBmcCredentials(UpdateBmcCredentialsRequest {
                    node_id,
                    version,
                    username: username.clone(),
                    password: password.clone(),
                })
            })
        }
    })
}

/// The password from its source (see [`PasswordSource`]); an empty one is refused here.
fn read_password(src: &PasswordSource) -> anyhow::Result<String> {
    let line = match &src.password_file {
        Some(path) => from_file(path)?,
        None if src.password_stdin => from_stdin()?,
        None => bail!("give --password-file or --password-stdin (never the password itself)"),
    };
    if line.is_empty() {
        bail!("the BMC password is empty");
    }
    Ok(line)
}

fn from_file(path: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the password file {}", path.display()))?;
    Ok(first_line(&text))
}

/// The first line without its line ending.
fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or_default().to_owned()
}

fn from_stdin() -> anyhow::Result<String> {
    let stdin = std::io::stdin();
    let mut line = String::new();
    if stdin.is_terminal() {
        eprint!("BMC password: ");
        std::io::stderr().flush().ok();
        let _echo = EchoOff::new(&stdin);
        stdin.lock().read_line(&mut line)?;
        eprintln!();
    } else {
        stdin.lock().read_line(&mut line)?;
    }
    Ok(first_line(&line))
}

/// Terminal echo off for as long as this lives (restored on drop).
struct EchoOff(Option<nix::sys::termios::Termios>);

impl EchoOff {
    fn new(stdin: &std::io::Stdin) -> Self {
        use nix::sys::termios::{LocalFlags, SetArg, tcgetattr, tcsetattr};
        let Ok(saved) = tcgetattr(stdin) else {
            return Self(None);
        };
        let mut quiet = saved.clone();
        quiet.local_flags.remove(LocalFlags::ECHO);
        if tcsetattr(stdin, SetArg::TCSANOW, &quiet).is_err() {
            return Self(None);
        }
        Self(Some(saved))
    }
}

impl Drop for EchoOff {
    fn drop(&mut self) {
        if let Some(saved) = &self.0 {
            let _ = nix::sys::termios::tcsetattr(
                std::io::stdin(),
                nix::sys::termios::SetArg::TCSANOW,
                saved,
            );
        }
    }
}

/// `sites get` as tables: the site and its lease, then its appliances.
pub fn site(v: &Value) -> String {
    let mut head = v.clone();
    if let Some(o) = head.as_object_mut() {
        o.remove("appliances");
    }
    let appliances = render::list(
        &items(v, "appliances"),
        &[
            ("APPLIANCE", "/nodeId"),
            ("HOSTNAME", "/hostname"),
            ("CONNECTIVITY", "/connectivity"),
            ("LEASE", "/holdsLease"),
            ("LAST SEEN", "/lastSeen"),
            ("VERSION", "/agentVersion"),
        ],
    );
    format!("{}\n{appliances}", render::object(&head))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_password_file_gives_its_first_line_without_the_newline() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let f = dir.path().join("pw");
        std::fs::write(&f, "s3cr3t pass\r\nignored\n")?;
        let src = PasswordSource {
            password_file: Some(f.clone()),
            password_stdin: false,
        };
        assert_eq!(read_password(&src)?, "s3cr3t pass");
        std::fs::write(&f, "\n")?;
        let err = read_password(&src).err().map(|e| e.to_string());
        assert_eq!(err.as_deref(), Some("the BMC password is empty"));
        Ok(())
    }

    #[test]
    fn the_site_table_lists_its_appliances_and_lease() {
        let v = json!({"id": "site_1", "name": "dc1", "lease": {"holderNodeId": "node_a", "epoch": 3},
            "appliances": [{"nodeId": "node_a", "connectivity": "connected", "holdsLease": true},
                           {"nodeId": "node_b", "connectivity": "unreachable", "holdsLease": false}]});
        let t = site(&v);
        assert!(
            t.contains("lease.holderNodeId") && t.contains("node_a"),
            "{t}"
        );
        assert!(t.contains("APPLIANCE") && t.contains("unreachable"), "{t}");
    }
}
