//! The command journal (`<state dir>/commands/<id>.json`): each accepted command is written
//! before it runs and again with its result before the result is reported. A command id found in
//! the journal is never run again: a second delivery re-sends the stored result, and a command
//! that was running when the agent died is reported failed, not re-run (exactly-once effect).
//!
//! [`Journal::memory`] keeps the same entries in memory for modes without a state dir (`bcd sim`):
//! at-most-once within the process, at most [`MEMORY_KEEP`] finished entries.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use bc_protocol::commands::CommandErrorCode;
use bc_protocol::pb::{CommandState, CommandUpdate, ErrorInfo};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::state::StateError;

/// Results older than this are not re-sent in Hello, ms (24 h).
pub const RESEND_WINDOW_MS: i64 = 24 * 3600 * 1000;
/// Entries older than this are removed at start, ms (7 days).
pub const KEEP_MS: i64 = 7 * 24 * 3600 * 1000;
/// Finished entries an in-memory journal keeps; the oldest go first.
pub const MEMORY_KEEP: usize = 128;

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

/// The journal: a directory of entries, or the same in memory.
#[derive(Debug)]
pub struct Journal {
    store: Store,
}

#[derive(Debug)]
enum Store {
    Dir(PathBuf),
    Memory(Mutex<BTreeMap<String, Entry>>),
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
        // `symlink_metadata`: a link to a directory elsewhere is followed by create_dir_all as
        // the operator made it; only something that is not a directory at all is refused.
        if fs::metadata(&dir).is_ok_and(|m| !m.is_dir())
            || fs::symlink_metadata(&dir).is_ok_and(|m| m.is_file())
        {
            return Err(StateError::WrongKind {
                path: dir,
                found: "is not a directory",
                want: "the command journal keeps one file per command in that directory",
                after: " (a new journal is made; commands journaled there before are not re-sent)",
            });
        }
        fs::create_dir_all(&dir).map_err(|source| StateError::Io {
            path: dir.clone(),
            source,
        })?;
        Ok(Self {
            store: Store::Dir(dir),
        })
    }

    /// A journal in memory only (no state dir).
    pub fn memory() -> Self {
        Self {
            store: Store::Memory(Mutex::new(BTreeMap::new())),
        }
    }

    fn path(dir: &Path, id: &str) -> Option<PathBuf> {
        valid_id(id).then(|| dir.join(format!("{id}.json")))
    }

    /// The entry for `id`; `None` when absent, unreadable, or the id is not a plain token.
    pub fn get(&self, id: &str) -> Option<Entry> {
        let dir = match &self.store {
            Store::Dir(dir) => dir,
            Store::Memory(m) => return valid_id(id).then(|| m.lock().get(id).cloned())?,
        };
        let text = fs::read_to_string(Self::path(dir, id)?).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Writes an entry (atomically, on disk).
    pub fn put(&self, e: &Entry) -> Result<(), StateError> {
        let not_plain = |dir: &Path| StateError::Io {
            path: dir.join(&e.id),
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "command id is not a plain token",
            ),
        };
        let dir = match &self.store {
            Store::Dir(dir) => dir,
            Store::Memory(m) => {
                if !valid_id(&e.id) {
                    return Err(not_plain(Path::new("memory")));
                }
                let mut m = m.lock();
                m.insert(e.id.clone(), e.clone());
                forget_oldest_finished(&mut m);
                return Ok(());
            }
        };
        let path = Self::path(dir, &e.id).ok_or_else(|| not_plain(dir))?;
        let data = serde_json::to_vec_pretty(e).map_err(|source| StateError::Corrupt {
            path: path.clone(),
            source,
        })?;
        Ok(bc_sys::atomic::write(&path, &data, 0o600)?)
    }

    /// Every readable entry, oldest first.
    pub fn entries(&self) -> Vec<Entry> {
        let dir = match &self.store {
            Store::Dir(dir) => dir,
            Store::Memory(m) => {
                let mut out: Vec<Entry> = m.lock().values().cloned().collect();
                out.sort_by(|a, b| (a.accepted_at, &a.id).cmp(&(b.accepted_at, &b.id)));
                return out;
            }
        };
        let Ok(rd) = fs::read_dir(dir) else {
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
                self.remove(&e.id);
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

    fn remove(&self, id: &str) {
        match &self.store {
            Store::Dir(dir) => {
                if let Some(p) = Self::path(dir, id) {
                    let _ = fs::remove_file(p);
                }
            }
            Store::Memory(m) => {
                m.lock().remove(id);
            }
        }
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

/// Keeps at most [`MEMORY_KEEP`] finished entries; unfinished ones always stay.
fn forget_oldest_finished(m: &mut BTreeMap<String, Entry>) {
    let mut finished: Vec<(i64, String)> = m
        .values()
        .filter(|e| e.is_finished())
        .map(|e| (e.finished_at.unwrap_or(e.accepted_at), e.id.clone()))
        .collect();
    let Some(excess) = finished.len().checked_sub(MEMORY_KEEP).filter(|n| *n > 0) else {
        return;
    };
    finished.sort_unstable();
    for (_, id) in finished.into_iter().take(excess) {
        m.remove(&id);
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

    #[test]
    fn a_memory_journal_keeps_the_same_promises_within_its_bound()
    -> Result<(), Box<dyn std::error::Error>> {
        let j = Journal::memory();
        j.put(&entry("cmd_done", "succeeded"))?;
        j.put(&entry("cmd_mid", "accepted"))?;
        assert_eq!(j.recover(10, |_| false).len(), 1);
        assert_eq!(j.get("cmd_mid").map(|e| e.state), Some("failed".to_owned()));
        assert!(j.put(&entry("../evil", "succeeded")).is_err());
        assert!(j.get("../evil").is_none());
        for i in 0..MEMORY_KEEP + 10 {
            let mut e = entry(&format!("cmd_{i}"), "succeeded");
            e.finished_at = Some(100 + i as i64);
            j.put(&e)?;
        }
        j.put(&entry("cmd_running", "accepted"))?;
        let all = j.entries();
        assert_eq!(all.iter().filter(|e| e.is_finished()).count(), MEMORY_KEEP);
        assert!(
            j.get("cmd_running").is_some(),
            "unfinished entries are never dropped"
        );
        assert!(
            j.get("cmd_0").is_none(),
            "the oldest finished entry went first"
        );
        assert!(j.get(&format!("cmd_{}", MEMORY_KEEP + 9)).is_some());
        Ok(())
    }
}
