//! The command journal (`<state dir>/commands/<id>.json`): each accepted command is written
//! before it runs and again with its result before the result is reported. A command id found in
//! the journal is never run again: a second delivery re-sends the stored result, and a command
//! that was running when the agent died is reported failed, not re-run (exactly-once effect).

use std::fs;
use std::path::{Path, PathBuf};

use bc_protocol::commands::CommandErrorCode;
use bc_protocol::pb::{CommandState, CommandUpdate, ErrorInfo};
use serde::{Deserialize, Serialize};

use crate::state::StateError;

/// Results older than this are not re-sent in Hello, ms (24 h).
pub const RESEND_WINDOW_MS: i64 = 24 * 3600 * 1000;
/// Entries older than this are removed at start, ms (7 days).
pub const KEEP_MS: i64 = 7 * 24 * 3600 * 1000;

/// A journal entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    pub id: String,
    pub name: String,
    pub args: serde_json::Value,
    /// accepted | succeeded | failed | cancelled
    pub state: String,
    pub result: Option<serde_json::Value>,
    pub error_code: Option<String>,
    pub error_message: Option<String>,
    /// Milliseconds since the Unix epoch.
    pub accepted_at: i64,
    pub finished_at: Option<i64>,
    /// Boot id when accepted (node.reboot compares it after the reboot).
    pub boot_id: String,
}

impl Entry {
    /// Whether the entry holds a final result.
    pub fn is_finished(&self) -> bool {
        self.state != "accepted"
    }

    /// The CommandUpdate that reports this entry.
    pub fn update(&self) -> CommandUpdate {
        let state = match self.state.as_str() {
            "succeeded" => CommandState::Succeeded,
            "cancelled" => CommandState::Cancelled,
            "accepted" => CommandState::Running,
            _ => CommandState::Failed,
        };
        CommandUpdate {
            id: self.id.clone(),
            state: state.into(),
            progress: if self.is_finished() { 100 } else { 0 },
            result_json: self
                .result
                .as_ref()
                .and_then(|r| serde_json::to_vec(r).ok())
                .unwrap_or_default(),
            error: self.error_code.as_ref().map(|code| ErrorInfo {
                code: code.clone(),
                message: self.error_message.clone().unwrap_or_default(),
            }),
        }
    }
}

/// The journal directory.
#[derive(Debug, Clone)]
pub struct Journal {
    dir: PathBuf,
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

impl Journal {
    /// Opens `<state dir>/commands`.
    pub fn open(state_dir: &Path) -> Result<Self, StateError> {
        let dir = state_dir.join("commands");
        fs::create_dir_all(&dir).map_err(|source| StateError::Io {
            path: dir.clone(),
            source,
        })?;
        Ok(Self { dir })
    }

    fn path(&self, id: &str) -> Option<PathBuf> {
        valid_id(id).then(|| self.dir.join(format!("{id}.json")))
    }

    /// The entry for `id`; `None` when absent, unreadable, or the id is not a plain token.
    pub fn get(&self, id: &str) -> Option<Entry> {
        let text = fs::read_to_string(self.path(id)?).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Writes an entry atomically.
    pub fn put(&self, e: &Entry) -> Result<(), StateError> {
        let path = self.path(&e.id).ok_or_else(|| StateError::Io {
            path: self.dir.join(&e.id),
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "command id is not a plain token",
            ),
        })?;
        let data = serde_json::to_vec_pretty(e).map_err(|source| StateError::Corrupt {
            path: path.clone(),
            source,
        })?;
        Ok(bc_sys::atomic::write(&path, &data, 0o600)?)
    }

    /// Every readable entry.
    pub fn entries(&self) -> Vec<Entry> {
        let Ok(rd) = fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut out: Vec<Entry> = rd
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
            .filter_map(|e| fs::read_to_string(e.path()).ok())
            .filter_map(|t| serde_json::from_str(&t).ok())
            .collect();
        out.sort_by(|a, b| (a.accepted_at, &a.id).cmp(&(b.accepted_at, &b.id)));
        out
    }

    /// At start: entries still `accepted` were interrupted by the agent's death; they become
    /// failed (never re-run), except those `keep` says to leave (a reboot waiting for its new boot).
    /// Old entries are removed.
    pub fn recover(&self, now_ms: i64, keep: impl Fn(&Entry) -> bool) -> Vec<Entry> {
        let mut changed = Vec::new();
        for mut e in self.entries() {
            if e.finished_at.is_some_and(|f| now_ms - f > KEEP_MS) {
                if let Some(p) = self.path(&e.id) {
                    let _ = fs::remove_file(p);
                }
                continue;
            }
            if !e.is_finished() && !keep(&e) {
                e.state = "failed".to_owned();
                e.error_code = Some(CommandErrorCode::AgentRestarted.as_str().to_owned());
                e.error_message = Some(
                    "the agent stopped while this command ran; it is not run again".to_owned(),
                );
                e.finished_at = Some(now_ms);
                if self.put(&e).is_ok() {
                    changed.push(e);
                }
            }
        }
        changed
    }

    /// Results to re-send in Hello: finished within the resend window, at most 100, newest last.
    pub fn pending_results(&self, now_ms: i64) -> Vec<CommandUpdate> {
        let mut fin: Vec<Entry> = self
            .entries()
            .into_iter()
            .filter(|e| {
                e.finished_at
                    .is_some_and(|f| now_ms - f <= RESEND_WINDOW_MS)
            })
            .collect();
        let skip = fin.len().saturating_sub(100);
        fin.drain(..skip);
        fin.iter().map(Entry::update).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: &str, state: &str) -> Entry {
        Entry {
            id: id.into(),
            name: "inventory.refresh".into(),
            args: serde_json::json!({}),
            state: state.into(),
            result: None,
            error_code: None,
            error_message: None,
            accepted_at: 1,
            finished_at: (state != "accepted").then_some(2),
            boot_id: "b".into(),
        }
    }

    #[test]
    fn interrupted_commands_fail_instead_of_rerunning() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let j = Journal::open(dir.path())?;
        j.put(&entry("cmd_done", "succeeded"))?;
        j.put(&entry("cmd_mid", "accepted"))?;
        j.put(&entry("cmd_reboot", "accepted"))?;
        let changed = j.recover(10, |e| e.id == "cmd_reboot");
        assert_eq!(changed.len(), 1);
        assert_eq!(j.get("cmd_mid").map(|e| e.state), Some("failed".to_owned()));
        assert_eq!(
            j.get("cmd_reboot").map(|e| e.state),
            Some("accepted".to_owned())
        );
        let pending = j.pending_results(10);
        let ids: Vec<&str> = pending.iter().map(|u| u.id.as_str()).collect();
        assert_eq!(ids, vec!["cmd_done", "cmd_mid"]);
        // Path tricks never escape the journal.
        assert!(j.get("../node").is_none());
        assert!(j.put(&entry("../evil", "succeeded")).is_err());
        Ok(())
    }
}
