//! `bcd agent` (and `bcd site`) configuration: `/etc/bcd/bcd.toml`, environment and flags.
//!
//! # Background
//! A node agent runs as a systemd service with a config file the package installs
//! (`packaging/bcd.toml`, documented key by key in `docs/operator-guide.md`), while tests and
//! one-off runs prefer flags and `BCD_*` environment variables.
//!
//! # Design
//! One serde struct, [`Config`], with `deny_unknown_fields` (a typo is an error, not a silently
//! ignored key) and a written [`Default`]. Precedence is defaults < file < environment < flags:
//! [`Config::load`] / [`Config::load_or_default`] give defaults overlaid by the file;
//! [`ConfigOverrides::from_env`] and the caller's flags are applied in that order with
//! [`Config::apply_overrides`]; [`Config::validate`] then reports every problem at once.
//!
//! `control_plane` is a list (one URL per control-plane replica); the file also takes a single
//! URL string, as it did before lists, so existing files keep working.
//!
//! `bcd site` reads the same file: the shared keys (control plane, join token file, CA pin, log,
//! root, journalctl) and its own `[site]` section (`bcd_site::config::SiteConfig`).
//!
//! # Limitations
//! The join token itself is never in the file, only the path of a file that holds it
//! (`join_token_file`), so the config can stay world-readable.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use bcd_core::endpoints::EndpointError;
use serde::{Deserialize, Deserializer, Serialize};

/// Where the packaged service reads its config (`ExecStart=… --config /etc/bcd/bcd.toml`).
pub const DEFAULT_PATH: &str = "/etc/bcd/bcd.toml";

/// What went wrong reading or checking the config.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("config {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML for [`Config`] (unknown key, wrong type); the message has the
    /// line and column.
    #[error("config {path}: {message}")]
    Parse { path: PathBuf, message: String },
    /// An environment variable that does not parse.
    #[error("environment {var}={value:?}: {reason}")]
    Env {
        var: &'static str,
        value: String,
        reason: String,
    },
    /// Every problem [`Config::validate`] found, one per line.
    #[error("invalid config:\n  {}", .0.join("\n  "))]
    Invalid(Vec<String>),
}

/// The agent's settings; each key is documented in `docs/operator-guide.md` ("Configuration").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Control plane gateway URLs, `https://host:port`, one per replica: in the file one URL or
    /// a list of them (`BCD_CONTROL_PLANE` and `--control-plane` take a comma-separated list).
    /// Joins and sessions go to them in a shuffled order. Needed to join; empty: the URL the
    /// node joined at (`node.json`).
    #[serde(deserialize_with = "one_or_many")]
    pub control_plane: Vec<String>,
    /// File holding the join token `<id>.<secret>`; read only while the node has no identity.
    pub join_token_file: Option<PathBuf>,
    /// Pin of the control plane's CA: `sha256:<64 hex digits of the CA's SubjectPublicKeyInfo
    /// SHA-256>` (kubeadm's discovery hash). One of `ca_pin` or `ca_file` is needed to join.
    pub ca_pin: Option<String>,
    /// PEM file with the control plane's CA, instead of a pin.
    pub ca_file: Option<PathBuf>,
    /// Identity, command journal and last applied spec. Default `/var/lib/bcd` (systemd's
    /// `StateDirectory=bcd`).
    pub state_dir: PathBuf,
    /// Host root prefix: `/sys`, `/proc`, `/dev`, `/etc` and home directories are resolved under
    /// it. Default `/`.
    pub root: PathBuf,
    /// Log filter in `tracing` EnvFilter syntax. Default `info`.
    pub log: String,
    /// NVML library to load; default: the loader finds `libnvidia-ml.so.1`.
    pub nvml_lib: Option<PathBuf>,
    /// `nvidia-smi` binary (used by `gpu.reset`). Default `nvidia-smi` on `PATH`.
    pub nvidia_smi: PathBuf,
    /// Command `node.reboot` runs, as argv. Default `["systemctl", "reboot"]`.
    pub reboot_command: Vec<String>,
    /// `journalctl` binary (used by `logs.collect`). Default `journalctl` on `PATH`.
    pub journalctl: PathBuf,
    /// Where to serve Prometheus metrics (`127.0.0.1:9464`); absent = no metrics listener.
    pub metrics_listen: Option<SocketAddr>,
    /// Listen for LLDP neighbours in the background and report them in every inventory
    /// (`bcd_probes::inventory::lldp::Watcher`; needs CAP_NET_RAW). Default true.
    pub lldp: bool,
    /// `bcd site` only: the `[site]` section (its state dir, power sync defaults, limits,
    /// timeouts, the ipmitool path); `BCD_SITE_<KEY>` variables and `bcd site` flags win.
    pub site: bcd_site::config::SiteConfig,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            control_plane: Vec::new(),
            join_token_file: None,
            ca_pin: None,
            ca_file: None,
            state_dir: PathBuf::from("/var/lib/bcd"),
            root: PathBuf::from("/"),
            log: "info".to_owned(),
            nvml_lib: None,
            nvidia_smi: PathBuf::from("nvidia-smi"),
            reboot_command: vec!["systemctl".to_owned(), "reboot".to_owned()],
            journalctl: PathBuf::from("journalctl"),
            metrics_listen: None,
            lldp: true,
            site: bcd_site::config::SiteConfig::default(),
        }
    }
}

/// Values that replace the file's: from the environment ([`ConfigOverrides::from_env`]) or from
/// flags (built by the caller). `None` leaves a value as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigOverrides {
    pub control_plane: Option<Vec<String>>,
    pub join_token_file: Option<PathBuf>,
    pub ca_pin: Option<String>,
    pub ca_file: Option<PathBuf>,
    pub state_dir: Option<PathBuf>,
    pub root: Option<PathBuf>,
    pub log: Option<String>,
    pub nvml_lib: Option<PathBuf>,
    pub nvidia_smi: Option<PathBuf>,
    pub reboot_command: Option<Vec<String>>,
    pub journalctl: Option<PathBuf>,
    pub metrics_listen: Option<SocketAddr>,
}

/// The environment variables [`ConfigOverrides::from_env`] reads, with their keys.
pub const ENV_VARS: &[(&str, &str)] = &[
    ("BCD_CONTROL_PLANE", "control_plane"),
    ("BCD_JOIN_TOKEN_FILE", "join_token_file"),
    ("BCD_CA_PIN", "ca_pin"),
    ("BCD_CA_FILE", "ca_file"),
    ("BCD_STATE_DIR", "state_dir"),
    ("BCD_ROOT", "root"),
    ("BCD_LOG", "log"),
    ("BCD_NVML_LIB", "nvml_lib"),
    ("BCD_NVIDIA_SMI", "nvidia_smi"),
    ("BCD_REBOOT_COMMAND", "reboot_command"),
    ("BCD_JOURNALCTL", "journalctl"),
    ("BCD_METRICS_LISTEN", "metrics_listen"),
];

impl ConfigOverrides {
    /// Overrides from `BCD_*` variables (see [`ENV_VARS`]), looked up through `var` so tests pass
    /// a map. An empty value counts as unset. `BCD_CONTROL_PLANE` is split on commas,
    /// `BCD_REBOOT_COMMAND` on whitespace.
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let get = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        let metrics_listen =
            match get("BCD_METRICS_LISTEN") {
                None => None,
                Some(v) => Some(v.trim().parse().map_err(|e: std::net::AddrParseError| {
                    ConfigError::Env {
                        var: "BCD_METRICS_LISTEN",
                        value: v.clone(),
                        reason: e.to_string(),
                    }
                })?),
            };
        Ok(Self {
            control_plane: get("BCD_CONTROL_PLANE")
                .map(|v| bcd_core::endpoints::split_list(&v))
                .filter(|l| !l.is_empty()),
            join_token_file: get("BCD_JOIN_TOKEN_FILE").map(PathBuf::from),
            ca_pin: get("BCD_CA_PIN"),
            ca_file: get("BCD_CA_FILE").map(PathBuf::from),
            state_dir: get("BCD_STATE_DIR").map(PathBuf::from),
            root: get("BCD_ROOT").map(PathBuf::from),
            log: get("BCD_LOG"),
            nvml_lib: get("BCD_NVML_LIB").map(PathBuf::from),
            nvidia_smi: get("BCD_NVIDIA_SMI").map(PathBuf::from),
            reboot_command: get("BCD_REBOOT_COMMAND")
                .map(|v| v.split_whitespace().map(str::to_owned).collect()),
            journalctl: get("BCD_JOURNALCTL").map(PathBuf::from),
            metrics_listen,
        })
    }

    /// Overrides from the process environment.
    pub fn from_process_env() -> Result<Self, ConfigError> {
        Self::from_env(|name| std::env::var(name).ok())
    }
}

impl Config {
    /// Defaults overlaid by the TOML file at `path`, which must exist.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_toml(&text, path)
    }

    /// Like [`Config::load`], but a missing file gives the defaults (the packaged default path
    /// on a machine configured only through flags).
    pub fn load_or_default(path: &Path) -> Result<Self, ConfigError> {
        match std::fs::metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            _ => Self::load(path),
        }
    }

    /// Defaults overlaid by TOML text; `path` only names the source in errors.
    pub fn from_toml(text: &str, path: &Path) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: e.to_string().trim_end().to_owned(),
        })
    }

    /// Replaces every value `o` sets. Apply the environment first, then flags.
    pub fn apply_overrides(&mut self, o: &ConfigOverrides) {
        fn set<T: Clone>(dst: &mut T, src: &Option<T>) {
            if let Some(v) = src {
                *dst = v.clone();
            }
        }
        fn set_opt<T: Clone>(dst: &mut Option<T>, src: &Option<T>) {
            if src.is_some() {
                dst.clone_from(src);
            }
        }
        set(&mut self.control_plane, &o.control_plane);
        set_opt(&mut self.join_token_file, &o.join_token_file);
        set_opt(&mut self.ca_pin, &o.ca_pin);
        set_opt(&mut self.ca_file, &o.ca_file);
        set(&mut self.state_dir, &o.state_dir);
        set(&mut self.root, &o.root);
        set(&mut self.log, &o.log);
        set_opt(&mut self.nvml_lib, &o.nvml_lib);
        set(&mut self.nvidia_smi, &o.nvidia_smi);
        set(&mut self.reboot_command, &o.reboot_command);
        set(&mut self.journalctl, &o.journalctl);
        set_opt(&mut self.metrics_listen, &o.metrics_listen);
    }

    /// The whole chain: defaults < file < environment < flags, then [`Config::validate`].
    /// `explicit` says the operator named the file (then it must exist).
    pub fn resolve(
        path: &Path,
        explicit: bool,
        env: &ConfigOverrides,
        flags: &ConfigOverrides,
    ) -> Result<Self, ConfigError> {
        let mut c = if explicit {
            Self::load(path)?
        } else {
            Self::load_or_default(path)?
        };
        c.apply_overrides(env);
        c.apply_overrides(flags);
        c.validate()?;
        Ok(c)
    }

    /// Checks values the types cannot: URL scheme, pin shape, absolute paths, a non-empty reboot
    /// command. Every problem is reported, not just the first.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Vec::new();
        for e in bcd_core::endpoints::check_list(&self.control_plane) {
            problems.push(match e {
                EndpointError::BadUrl(u) => {
                    format!("control_plane {u:?}: expected https://host:port")
                }
                EndpointError::Duplicate(u) => format!("control_plane {u:?}: listed twice"),
            });
        }
        if let Some(pin) = &self.ca_pin {
            let ok = pin
                .strip_prefix("sha256:")
                .is_some_and(|h| h.len() == 64 && h.bytes().all(|c| c.is_ascii_hexdigit()));
            if !ok {
                problems.push(format!("ca_pin {pin:?}: expected sha256:<64 hex digits>"));
            }
        }
        for (key, p) in [("state_dir", &self.state_dir), ("root", &self.root)] {
            if !p.is_absolute() {
                problems.push(format!("{key} {}: must be an absolute path", p.display()));
            }
        }
        if self.reboot_command.first().is_none_or(|c| c.is_empty()) {
            problems.push("reboot_command: must name a program".to_owned());
        }
        if self.log.trim().is_empty() {
            problems.push("log: empty filter".to_owned());
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid(problems))
        }
    }
}

/// A list flag's values (`--control-plane a,b --control-plane c`): trimmed, empty items dropped;
/// `None` when nothing is left, so the file's or the environment's value stays.
pub fn flag_list(values: &[String]) -> Option<Vec<String>> {
    let list: Vec<String> = values
        .iter()
        .flat_map(|v| bcd_core::endpoints::split_list(v))
        .collect();
    (!list.is_empty()).then_some(list)
}

/// `control_plane` in the file: one URL as before lists (a comma-separated string is split
/// like `BCD_CONTROL_PLANE`), or an array of URLs.
fn one_or_many<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    struct Urls;
    impl<'de> serde::de::Visitor<'de> for Urls {
        type Value = Vec<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a URL \"https://host:port\" or an array of them")
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Ok(bcd_core::endpoints::split_list(v))
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Self::Value, A::Error> {
            let mut urls = Vec::new();
            while let Some(u) = seq.next_element::<String>()? {
                urls.push(u.trim().to_owned());
            }
            Ok(urls)
        }
    }
    d.deserialize_any(Urls)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const PACKAGED: &str = include_str!("../../packaging/bcd.toml");

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn packaged_file_parses_to_the_defaults() -> Result<(), ConfigError> {
        let c = Config::from_toml(PACKAGED, Path::new("packaging/bcd.toml"))?;
        assert_eq!(c, Config::default());
        c.validate()
    }

    #[test]
    fn every_key_in_the_packaged_file_is_a_config_key() {
        // Uncommenting any documented key must still parse: the file documents real keys only.
        let uncommented: String = PACKAGED
            .lines()
            .map(|l| {
                l.strip_prefix("# ")
                    .filter(|r| r.contains(" = "))
                    .unwrap_or(l)
            })
            .collect::<Vec<_>>()
            .join("\n");
        let c = Config::from_toml(&uncommented, Path::new("x"));
        assert!(c.is_ok(), "{c:?}");
        let c = c.unwrap_or_default();
        assert!(!c.control_plane.is_empty(), "example keys were uncommented");
        assert!(c.validate().is_ok(), "{:?}", c.validate());
    }

    #[test]
    fn lldp_is_on_unless_the_file_turns_it_off() -> Result<(), ConfigError> {
        assert!(Config::default().lldp);
        let c = Config::from_toml("lldp = false\n", Path::new("bcd.toml"))?;
        assert!(!c.lldp);
        Ok(())
    }

    #[test]
    fn unknown_key_is_an_error_with_its_line() {
        let err = Config::from_toml(
            "state_dir = \"/x\"\ncontrol_plain = \"https://a\"\n",
            Path::new("/etc/bcd/bcd.toml"),
        );
        let msg = err.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(msg.contains("control_plain"), "{msg}");
        assert!(msg.contains("line 2"), "{msg}");
        assert!(msg.contains("/etc/bcd/bcd.toml"), "{msg}");
    }

    #[test]
    fn precedence_is_defaults_file_env_flags() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("bcd.toml");
        std::fs::write(
            &path,
            "control_plane = \"https://file:7443\"\nstate_dir = \"/srv/bcd\"\nlog = \"debug\"\n",
        )?;
        let env = ConfigOverrides::from_env(env(&[
            ("BCD_STATE_DIR", "/env/bcd"),
            ("BCD_LOG", "trace"),
            ("BCD_REBOOT_COMMAND", "/sbin/reboot -f"),
            ("BCD_CONTROL_PLANE", ""),
        ]))?;
        let flags = ConfigOverrides {
            log: Some("warn".to_owned()),
            ..ConfigOverrides::default()
        };
        let c = Config::resolve(&path, true, &env, &flags)?;
        assert_eq!(c.control_plane, ["https://file:7443"]);
        assert_eq!(c.state_dir, PathBuf::from("/env/bcd"));
        assert_eq!(c.log, "warn");
        assert_eq!(c.reboot_command, ["/sbin/reboot", "-f"]);
        assert_eq!(c.journalctl, PathBuf::from("journalctl"));
        Ok(())
    }

    #[test]
    fn missing_file_is_defaults_unless_named() {
        let path = Path::new("/nonexistent/bcd.toml");
        let none = ConfigOverrides::default();
        assert_eq!(
            Config::resolve(path, false, &none, &none).ok(),
            Some(Config::default())
        );
        assert!(matches!(
            Config::resolve(path, true, &none, &none),
            Err(ConfigError::Read { .. })
        ));
    }

    #[test]
    fn validate_reports_every_problem() {
        let c = Config {
            control_plane: vec!["cp.example:7443".to_owned()],
            ca_pin: Some("sha256:abc".to_owned()),
            state_dir: PathBuf::from("var/lib/bcd"),
            reboot_command: vec![],
            ..Config::default()
        };
        match c.validate() {
            Err(ConfigError::Invalid(p)) => assert_eq!(p.len(), 4, "{p:?}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn control_plane_is_a_url_or_a_list_in_the_file() -> Result<(), ConfigError> {
        let path = Path::new("bcd.toml");
        let one = Config::from_toml("control_plane = \"https://a:7443\"\n", path)?;
        assert_eq!(one.control_plane, ["https://a:7443"]);
        let list = Config::from_toml(
            "control_plane = [\"https://a:7443\", \"https://b:7443\"]\n",
            path,
        )?;
        assert_eq!(list.control_plane, ["https://a:7443", "https://b:7443"]);
        list.validate()?;
        let none = Config::from_toml("", path)?;
        assert!(none.control_plane.is_empty());
        let wrong = Config::from_toml("control_plane = 7443\n", path);
        let msg = wrong.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            msg.contains("a URL \"https://host:port\" or an array of them"),
            "{msg}"
        );
        Ok(())
    }

    #[test]
    fn control_plane_env_is_a_comma_list_and_replaces_the_file() -> Result<(), ConfigError> {
        let env = ConfigOverrides::from_env(env(&[(
            "BCD_CONTROL_PLANE",
            "https://a:7443, https://b:7443,",
        )]))?;
        assert_eq!(
            env.control_plane.as_deref(),
            Some(["https://a:7443".to_owned(), "https://b:7443".to_owned()].as_slice())
        );
        let mut c = Config::from_toml("control_plane = \"https://file:7443\"\n", Path::new("x"))?;
        c.apply_overrides(&env);
        assert_eq!(c.control_plane, ["https://a:7443", "https://b:7443"]);
        Ok(())
    }

    #[test]
    fn each_bad_control_plane_url_is_named() {
        let c = Config {
            control_plane: vec![
                "https://good:7443".to_owned(),
                "http://plain:7443".to_owned(),
                "https://good:7443".to_owned(),
                "good:7443".to_owned(),
            ],
            ..Config::default()
        };
        match c.validate() {
            Err(ConfigError::Invalid(p)) => assert_eq!(
                p,
                [
                    "control_plane \"http://plain:7443\": expected https://host:port",
                    "control_plane \"https://good:7443\": listed twice",
                    "control_plane \"good:7443\": expected https://host:port",
                ]
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn bad_env_value_names_the_variable() {
        let err = ConfigOverrides::from_env(env(&[("BCD_METRICS_LISTEN", "localhost")]));
        let msg = err.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(msg.contains("BCD_METRICS_LISTEN"), "{msg}");
    }
}
