//! Commands: one row per command, its lifecycle persisted. Finished states never change again,
//! so a result re-sent by an agent after a reconnect or restart is applied once.

use crate::db::{Db, Row};
use crate::params;
use serde::{Deserialize, Serialize};

use super::{Reader, StoreError, Tx, from_json, parse_enum, to_json};
use bc_protocol::CommandName;

/// Lifecycle state of a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CommandState {
    Queued,
    Sent,
    Running,
    Succeeded,
    Failed,
    Cancelled,
    Expired,
}

impl CommandState {
    /// The spelling in the API and the store.
    pub fn as_str(self) -> &'static str {
        match self {
            CommandState::Queued => "queued",
            CommandState::Sent => "sent",
            CommandState::Running => "running",
            CommandState::Succeeded => "succeeded",
            CommandState::Failed => "failed",
            CommandState::Cancelled => "cancelled",
            CommandState::Expired => "expired",
        }
    }

    /// Parses the store's spelling.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "queued" => CommandState::Queued,
            "sent" => CommandState::Sent,
            "running" => CommandState::Running,
            "succeeded" => CommandState::Succeeded,
            "failed" => CommandState::Failed,
            "cancelled" => CommandState::Cancelled,
            "expired" => CommandState::Expired,
            _ => return None,
        })
    }

    /// Whether the command is over.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            CommandState::Succeeded
                | CommandState::Failed
                | CommandState::Cancelled
                | CommandState::Expired
        )
    }
}

/// A command row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CommandRecord {
    pub id: String,
    pub node_id: String,
    /// The command; its text exists only in the `name` column.
    pub name: CommandName,
    pub args: serde_json::Value,
    pub state: CommandState,
    /// 0..=100.
    pub progress: u32,
    pub result: Option<serde_json::Value>,
    pub error_code: Option<String>,
    pub error_message: Option<String>,
    pub actor: String,
    /// Milliseconds since the Unix epoch.
    pub created_at: i64,
    pub sent_at: Option<i64>,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
    pub deadline_at: i64,
    /// The bare-metal node a `bmc.*` command acts on (`node_id` is the site agent that runs it).
    #[serde(default)]
    pub subject_node_id: Option<String>,
}

const COLUMNS: &str = "id, node_id, name, args, state, progress, result, error_code, error_message, actor, \
    created_at, sent_at, started_at, finished_at, deadline_at, subject_node_id";

fn from_row(r: &Row<'_>) -> Result<CommandRecord, StoreError> {
    let state: String = r.get(4)?;
    let result: Option<String> = r.get(6)?;
    let progress: i64 = r.get(5)?;
    Ok(CommandRecord {
        id: r.get(0)?,
        node_id: r.get(1)?,
        name: parse_enum("name", &r.get::<String>(2)?)?,
        args: from_json("args", &r.get::<String>(3)?)?,
        state: CommandState::parse(&state).unwrap_or(CommandState::Failed),
        progress: u32::try_from(progress.clamp(0, 100)).unwrap_or(0),
        result: result.map(|s| from_json("result", &s)).transpose()?,
        error_code: r.get(7)?,
        error_message: r.get(8)?,
        actor: r.get(9)?,
        created_at: r.get(10)?,
        sent_at: r.get(11)?,
        started_at: r.get(12)?,
        finished_at: r.get(13)?,
        deadline_at: r.get(14)?,
        subject_node_id: r.get(15)?,
    })
}

fn query(
    conn: Db<'_>,
    sql_where: &str,
    p: crate::db::Params<'_>,
) -> Result<Vec<CommandRecord>, StoreError> {
    let mut stmt = conn.prepare_cached(&format!("SELECT {COLUMNS} FROM commands {sql_where}"))?;
    stmt.query_map(p, from_row)?.collect()
}

impl Tx<'_> {
    /// Inserts a queued command.
    pub fn insert_command(&self, c: &CommandRecord) -> Result<(), StoreError> {
        self.db().execute(
            &format!("INSERT INTO commands ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, 0, NULL, NULL, NULL, ?6, ?7, NULL, NULL, NULL, ?8, ?9)"),
            params![c.id, c.node_id, c.name.as_str(), to_json(&c.args), c.state.as_str(), c.actor, c.created_at, c.deadline_at, c.subject_node_id],
        )?;
        Ok(())
    }

    /// Replaces a command's stored arguments (to drop what must not be kept once it is over:
    /// cloud-init user data). Returns whether the command exists.
    pub fn set_command_args(&self, id: &str, args: &serde_json::Value) -> Result<bool, StoreError> {
        let n = self.db().execute(
            "UPDATE commands SET args = ?2 WHERE id = ?1",
            params![id, to_json(args)],
        )?;
        Ok(n > 0)
    }

    /// Marks a queued command sent at `now`.
    pub fn mark_command_sent(&self, id: &str, now: i64) -> Result<(), StoreError> {
        self.db().execute(
            "UPDATE commands SET state = 'sent', sent_at = COALESCE(sent_at, ?2) WHERE id = ?1 AND state = 'queued'",
            params![id, now],
        )?;
        Ok(())
    }

    /// An update from the agent of `node_id`, at `now`. Ignored once the command is final
    /// (results re-sent after a reconnect change nothing). Returns the command before and after;
    /// `None` for a command this node does not have.
    #[allow(clippy::too_many_arguments)]
    pub fn apply_command_update(
        &self,
        id: &str,
        node_id: &str,
        state: CommandState,
        progress: u32,
        result: Option<serde_json::Value>,
        error: Option<(String, String)>,
        now: i64,
    ) -> Result<Option<(CommandRecord, CommandRecord)>, StoreError> {
        let tx = self.db();
        let Some(cur) = query(tx, "WHERE id = ?1 AND node_id = ?2", params![id, node_id])?
            .into_iter()
            .next()
        else {
            return Ok(None);
        };
        if cur.state.is_final() {
            return Ok(Some((cur.clone(), cur)));
        }
        let (code, message) = error.unzip();
        tx.execute(
            "UPDATE commands SET state = ?2, progress = ?3, result = COALESCE(?4, result), error_code = ?5, \
             error_message = ?6, started_at = CASE WHEN ?2 = 'running' THEN COALESCE(started_at, ?7) ELSE started_at END, \
             finished_at = CASE WHEN ?2 IN ('succeeded','failed','cancelled','expired') THEN ?7 ELSE NULL END \
             WHERE id = ?1",
            params![
                id,
                state.as_str(),
                progress.min(100),
                result.as_ref().map(to_json),
                code,
                message,
                now
            ],
        )?;
        Ok(self.command(id)?.map(|after| (cur, after)))
    }

    /// Ends a command that is not over yet with `state` (`cancelled` or `expired`) and a reason,
    /// at `now`. Returns whether it was still open.
    pub fn finish_command(
        &self,
        id: &str,
        state: CommandState,
        code: &str,
        message: &str,
        now: i64,
    ) -> Result<bool, StoreError> {
        let n = self.db().execute(
            "UPDATE commands SET state = ?2, error_code = ?3, error_message = ?4, finished_at = ?5 \
             WHERE id = ?1 AND state IN ('queued', 'sent', 'running')",
            params![id, state.as_str(), code, message, now],
        )?;
        Ok(n == 1)
    }
}

impl Reader<'_> {
    /// One command.
    pub fn command(&self, id: &str) -> Result<Option<CommandRecord>, StoreError> {
        Ok(query(self.db(), "WHERE id = ?1", params![id])?
            .into_iter()
            .next())
    }

    /// Commands, newest first, optionally of one node (the node that runs them, or the bare-metal
    /// node a `bmc.*` command acts on); at most `limit`.
    pub fn commands(
        &self,
        node_id: Option<&str>,
        limit: u32,
    ) -> Result<Vec<CommandRecord>, StoreError> {
        let conn = self.db();
        match node_id {
            Some(n) => query(
                conn,
                "WHERE node_id = ?1 OR subject_node_id = ?1 ORDER BY created_at DESC, id LIMIT ?2",
                params![n, limit],
            ),
            None => query(
                conn,
                "ORDER BY created_at DESC, id LIMIT ?1",
                params![limit],
            ),
        }
    }

    /// A node's commands that are not over yet, oldest first (the per-node queue).
    pub fn open_commands(&self, node_id: &str) -> Result<Vec<CommandRecord>, StoreError> {
        query(
            self.db(),
            "WHERE node_id = ?1 AND state IN ('queued', 'sent', 'running') ORDER BY created_at, id",
            params![node_id],
        )
    }

    /// The `bmc.*` commands of site agent `node_id` that are not over yet, oldest first.
    pub fn open_bmc_commands(&self, node_id: &str) -> Result<Vec<CommandRecord>, StoreError> {
        query(
            self.db(),
            "WHERE node_id = ?1 AND name LIKE 'bmc.%' AND state IN ('queued', 'sent', 'running') \
             ORDER BY created_at, id",
            params![node_id],
        )
    }

    /// Commands past their deadline at `now` and not over yet.
    pub fn overdue_commands(&self, now: i64) -> Result<Vec<CommandRecord>, StoreError> {
        query(
            self.db(),
            "WHERE state IN ('queued', 'sent', 'running') AND deadline_at <= ?1 ORDER BY deadline_at",
            params![now],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(id: &str) -> CommandRecord {
        CommandRecord {
            id: id.into(),
            node_id: "node_a".into(),
            name: CommandName::InventoryRefresh,
            args: serde_json::json!({}),
            state: CommandState::Queued,
            progress: 0,
            result: None,
            error_code: None,
            error_message: None,
            actor: "operator".into(),
            created_at: 1,
            sent_at: None,
            started_at: None,
            finished_at: None,
            deadline_at: 10,
            subject_node_id: None,
        }
    }

    #[test]
    fn final_states_never_change_and_deadlines_expire() -> Result<(), StoreError> {
        let store = crate::testing::store()?;
        store.write_blocking(|c| {
            c.insert_command(&cmd("cmd_1"))?;
            c.insert_command(&cmd("cmd_2"))?;
            c.mark_command_sent("cmd_1", 2)?;
            let r = c
                .apply_command_update(
                    "cmd_1",
                    "node_a",
                    CommandState::Succeeded,
                    100,
                    Some(serde_json::json!({"ok": true})),
                    None,
                    3,
                )?
                .map(|(_, after)| after);
            assert_eq!(r.map(|r| r.state), Some(CommandState::Succeeded));
            // A re-sent failure after success changes nothing.
            let r = c
                .apply_command_update(
                    "cmd_1",
                    "node_a",
                    CommandState::Failed,
                    0,
                    None,
                    Some(("X".into(), "y".into())),
                    4,
                )?
                .map(|(_, after)| after);
            assert_eq!(r.as_ref().map(|r| r.state), Some(CommandState::Succeeded));
            assert_eq!(
                r.and_then(|r| r.result),
                Some(serde_json::json!({"ok": true}))
            );
            // Another node cannot update it.
            assert!(
                c.apply_command_update("cmd_2", "node_b", CommandState::Running, 1, None, None, 5)?
                    .is_none()
            );
            let due = c.overdue_commands(10)?;
            assert_eq!(
                due.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
                vec!["cmd_2"]
            );
            assert!(c.finish_command(
                "cmd_2",
                CommandState::Expired,
                "DEADLINE_EXCEEDED",
                "past deadline",
                10
            )?);
            assert!(!c.finish_command(
                "cmd_2",
                CommandState::Cancelled,
                "CANCELLED",
                "late",
                11
            )?);
            assert!(c.open_commands("node_a")?.is_empty());
            Ok(())
        })
    }
}
