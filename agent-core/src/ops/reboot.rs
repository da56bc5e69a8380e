//! `node.reboot {mode: graceful|force, delaySeconds}` on the agent.
//!
//! The command's result is not known until the machine is back: the agent journals the intent
//! with the current boot id (`/proc/sys/kernel/random/boot_id`), says `Goodbye{rebooting}`, waits
//! `delaySeconds` and runs the reboot command. At the next agent start [`complete_after_boot`]
//! (run before `Journal::recover`) marks those whose boot id differs succeeded with
//! `{previousBootId, bootId}`, and [`keep_pending`] keeps an entry whose boot id is still the
//! current one (the reboot has not happened yet); the result then travels in Hello's
//! `pending_results`. A machine that never comes back is expired by the control plane's deadline.

use std::time::Duration;

use bc_protocol::CommandName;
use bc_protocol::commands::{CommandErrorCode, CommandFailure};

use crate::executor::CommandRun;
use crate::journal::{Entry, Journal};

/// The command name this module serves.
pub const NAME: CommandName = CommandName::NodeReboot;

pub use bc_protocol::commands::reboot::{MAX_DELAY_SECONDS, RebootArgs, RebootMode, RebootResult};

/// `--reboot-command` value that calls reboot(2) directly (the ramdisk has no service manager).
pub const SYSCALL: &str = "reboot(2)";

/// How the agent reboots the machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RebootConfig {
    /// Program and arguments (`--reboot-command`, split on whitespace). Default `systemctl reboot`;
    /// [`SYSCALL`] alone means sync(2) then reboot(2) with `RB_AUTOBOOT`.
    pub command: Vec<String>,
}

impl Default for RebootConfig {
    fn default() -> Self {
        Self::from_command_line("systemctl reboot")
    }
}

impl RebootConfig {
    /// From a command line split on whitespace.
    pub fn from_command_line(line: &str) -> Self {
        Self {
            command: line.split_whitespace().map(str::to_owned).collect(),
        }
    }

    /// Whether this is the reboot(2) call rather than a program.
    pub fn is_syscall(&self) -> bool {
        self.command.len() == 1 && self.command[0] == SYSCALL
    }

    fn is_systemctl(&self) -> bool {
        self.command
            .first()
            .is_some_and(|p| p.ends_with("systemctl"))
    }
}

/// Why a reboot could not be started.
#[derive(Debug, thiserror::Error)]
pub enum RebootError {
    #[error("node.reboot args: {0}")]
    BadArgs(String),
    #[error("no reboot command configured (--reboot-command is empty)")]
    NoCommand,
    #[error("starting the reboot command {program}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("reboot(2): {0}")]
    Syscall(nix::errno::Errno),
    #[error("the reboot command {program} exited with {status}: {stderr}")]
    Failed {
        program: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
}

impl RebootError {
    /// The command error code.
    pub fn code(&self) -> CommandErrorCode {
        match self {
            RebootError::BadArgs(_) => CommandErrorCode::InvalidArgument,
            RebootError::NoCommand => CommandErrorCode::Unsupported,
            RebootError::Spawn { .. } | RebootError::Failed { .. } | RebootError::Syscall(_) => {
                CommandErrorCode::RebootFailed
            }
        }
    }
}

/// Parses and checks the args.
pub fn parse_args(args: &serde_json::Value) -> Result<RebootArgs, RebootError> {
    let a: RebootArgs =
        serde_json::from_value(args.clone()).map_err(|e| RebootError::BadArgs(e.to_string()))?;
    if a.delay_seconds > MAX_DELAY_SECONDS {
        return Err(RebootError::BadArgs(format!(
            "delaySeconds {} is over {MAX_DELAY_SECONDS}",
            a.delay_seconds
        )));
    }
    Ok(a)
}

/// Waits `delaySeconds`, then runs the reboot command and waits for it to exit. With `force` and
/// the default `systemctl`, `--force` is added; any command sees `BCD_REBOOT_MODE=graceful|force`.
/// Returns once the command exited 0: the machine is going down.
pub async fn start(cfg: &RebootConfig, args: &RebootArgs) -> Result<(), RebootError> {
    let Some((program, rest)) = cfg.command.split_first() else {
        return Err(RebootError::NoCommand);
    };
    tokio::time::sleep(Duration::from_secs(args.delay_seconds)).await;
    if cfg.is_syscall() {
        tracing::warn!(
            mode = args.mode.as_str(),
            "rebooting the machine through reboot(2)"
        );
        // Both modes are immediate here: there are no services to stop in the ramdisk.
        nix::unistd::sync();
        return match nix::sys::reboot::reboot(nix::sys::reboot::RebootMode::RB_AUTOBOOT) {
            Ok(never) => match never {},
            Err(e) => Err(RebootError::Syscall(e)),
        };
    }
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(rest)
        .env("BCD_REBOOT_MODE", args.mode.as_str())
        .stdin(std::process::Stdio::null())
        .kill_on_drop(false);
    if args.mode == RebootMode::Force && cfg.is_systemctl() {
        cmd.arg("--force");
    }
    tracing::warn!(command = ?cfg.command, mode = args.mode.as_str(), "rebooting the machine");
    let out = cmd.output().await.map_err(|source| RebootError::Spawn {
        program: program.clone(),
        source,
    })?;
    if !out.status.success() {
        return Err(RebootError::Failed {
            program: program.clone(),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(())
}

/// `Goodbye{GOODBYE_REASON_REBOOTING}` for the session of `epoch`.
pub fn goodbye(epoch: u64, boot_id: &str) -> bc_protocol::pb::AgentMessage {
    bc_protocol::pb::AgentMessage {
        epoch,
        msg: Some(bc_protocol::pb::agent_message::Msg::Goodbye(
            bc_protocol::pb::Goodbye {
                reason: bc_protocol::pb::GoodbyeReason::Rebooting.into(),
                message: format!("node.reboot from boot {boot_id}"),
            },
        )),
    }
}

/// The `node.reboot` handler: says Goodbye and reboots. It never returns a result: the result
/// comes with the next boot ([`complete_after_boot`]), or the control plane expires the command
/// if the machine never comes back.
pub async fn handle(
    cfg: &RebootConfig,
    boot_id: &str,
    run: &CommandRun,
) -> Result<serde_json::Value, CommandFailure> {
    let fail = |e: RebootError| CommandFailure::new(e.code(), e.to_string());
    let a = parse_args(&run.args).map_err(fail)?;
    let bye = goodbye(run.link.epoch, boot_id);
    // reboot(2) does not return: say Goodbye first. A program (systemctl) returns once the
    // reboot is under way, so a failure can still be reported on this session.
    if cfg.is_syscall() {
        let _ = run.link.out.send(bye.clone()).await;
    }
    start(cfg, &a).await.map_err(fail)?;
    let _ = run.link.out.send(bye).await;
    std::future::pending().await
}

/// For [`Journal::recover`]'s `keep`: a node.reboot accepted in this same boot is still pending
/// (the machine has not gone down yet, or the agent restarted before it did).
pub fn keep_pending(e: &Entry, current_boot_id: &str) -> bool {
    e.name == NAME.as_str() && !current_boot_id.is_empty() && e.boot_id == current_boot_id
}

/// At agent start, before `recover`: every unfinished node.reboot accepted under another boot id
/// is marked succeeded with `{previousBootId, bootId}`. Returns the entries changed.
pub fn complete_after_boot(journal: &Journal, current_boot_id: &str, now_ms: i64) -> Vec<Entry> {
    if current_boot_id.is_empty() {
        return Vec::new();
    }
    let mut done = Vec::new();
    for mut e in journal.entries() {
        if e.name != NAME.as_str() || e.is_finished() || e.boot_id == current_boot_id {
            continue;
        }
        e.state = "succeeded".to_owned();
        e.result = serde_json::to_value(RebootResult {
            boot_id: current_boot_id.to_owned(),
            previous_boot_id: e.boot_id.clone(),
        })
        .ok();
        e.finished_at = Some(now_ms);
        match journal.put(&e) {
            Ok(()) => done.push(e),
            Err(err) => {
                tracing::error!(command_id = %e.id, error = %err, "cannot journal the reboot result")
            }
        }
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: &str, name: &str, boot: &str) -> Entry {
        Entry {
            id: id.into(),
            name: name.into(),
            args: serde_json::json!({}),
            state: "accepted".into(),
            result: None,
            error_code: None,
            error_message: None,
            accepted_at: 1,
            finished_at: None,
            boot_id: boot.into(),
        }
    }

    #[test]
    fn reboot_completes_only_under_a_new_boot_id() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let j = Journal::open(dir.path())?;
        j.put(&entry("cmd_same", NAME.as_str(), "boot-a"))?;
        j.put(&entry("cmd_old", NAME.as_str(), "boot-old"))?;
        j.put(&entry("cmd_other", "inventory.refresh", "boot-old"))?;
        let done = complete_after_boot(&j, "boot-a", 20);
        assert_eq!(done.len(), 1);
        let failed = j.recover(30, |e| keep_pending(e, "boot-a"));
        assert_eq!(failed.len(), 1, "only the non-reboot entry fails");
        assert_eq!(failed[0].id, "cmd_other");
        let old = j.get("cmd_old").ok_or("cmd_old missing")?;
        assert_eq!(old.state, "succeeded");
        assert_eq!(
            old.result,
            Some(serde_json::json!({"previousBootId": "boot-old", "bootId": "boot-a"}))
        );
        assert_eq!(j.get("cmd_same").map(|e| e.state), Some("accepted".into()));
        assert!(keep_pending(&entry("x", NAME.as_str(), "boot-a"), "boot-a"));
        assert!(!keep_pending(&entry("x", NAME.as_str(), "boot-a"), ""));
        assert!(!keep_pending(&entry("x", "gpu.reset", "boot-a"), "boot-a"));
        Ok(())
    }

    #[test]
    fn args_are_checked() {
        assert!(parse_args(&serde_json::json!({"mode": "force", "delaySeconds": 2})).is_ok());
        assert!(parse_args(&serde_json::json!({"mode": "sideways"})).is_err());
        assert!(RebootConfig::from_command_line(" reboot(2) ").is_syscall());
        assert!(!RebootConfig::default().is_syscall());
        assert!(parse_args(&serde_json::json!({"delaySeconds": 99999})).is_err());
        assert!(parse_args(&serde_json::json!({"delay": 1})).is_err());
        assert_eq!(
            parse_args(&serde_json::json!({})).map(|a| a.mode).ok(),
            Some(RebootMode::Graceful)
        );
    }

    #[tokio::test]
    async fn a_failing_reboot_command_is_an_error() {
        let cfg = RebootConfig::from_command_line("false");
        let r = start(&cfg, &RebootArgs::default()).await;
        assert!(matches!(r, Err(RebootError::Failed { .. })), "{r:?}");
        let r = start(&RebootConfig { command: vec![] }, &RebootArgs::default()).await;
        assert!(matches!(r, Err(RebootError::NoCommand)));
        let r = start(
            &RebootConfig::from_command_line("true"),
            &RebootArgs::default(),
        )
        .await;
        assert!(r.is_ok());
    }
}
