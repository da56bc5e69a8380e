//! `bcctl nodes run --wait`: follows a command to its end, showing its progress, and fails
//! naming the error when it did not succeed.

use std::time::Duration;

use anyhow::bail;
use cpl_core::text::Id;
use cpl_core::verbs::{CommandRef, Request};
use serde_json::Value;

use super::call::print;
use super::{ClientArgs, Output, render};
use controlplane_lite::client::Client;

/// Polls a command until it is over, printing progress; fails unless it succeeded.
pub(crate) async fn follow(args: &ClientArgs, c: &Client, id: &str) -> anyhow::Result<()> {
    let mut last = String::new();
    loop {
        let get = Request::CommandsGet(CommandRef {
            command_id: Id::unchecked(id),
        });
        let v: Value = c.request(&get).await?;
        let state = v
            .get("state")
            .and_then(Value::as_str)
            .unwrap_or("?")
            .to_owned();
        let progress = v.get("progress").and_then(Value::as_u64).unwrap_or(0);
        let line = format!("{id} {state} {progress}%");
        if line != last && args.output == Output::Table {
            eprintln!("{line}");
            last = line;
        }
        if matches!(
            state.as_str(),
            "succeeded" | "failed" | "cancelled" | "expired"
        ) {
            print(args, &v, render::object)?;
            if state != "succeeded" {
                bail!("{}", failure_line(id, &state, &v));
            }
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What `nodes run --wait` says when a command did not succeed: its state, and the error code
/// and message the agent (or the control plane: `DEADLINE_EXCEEDED`, `CANCELLED`) gave.
fn failure_line(id: &str, state: &str, v: &Value) -> String {
    let err = v.get("error");
    let code = err.and_then(|e| e.get("code")).and_then(Value::as_str);
    let message = err.and_then(|e| e.get("message")).and_then(Value::as_str);
    match (code, message) {
        (Some(c), Some(m)) if !m.is_empty() => {
            format!("command {id} {state}: {c}: {}", super::table::safe(m))
        }
        (Some(c), _) => format!("command {id} {state}: {c}"),
        _ => format!("command {id} {state}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_failed_command_says_its_code_and_message() {
        let v = json!({"state": "failed", "error": {"code": "GPU_BUSY", "message": "pid 42 runs on 0000:1a:00.0"}});
        assert_eq!(
            failure_line("cmd_1", "failed", &v),
            "command cmd_1 failed: GPU_BUSY: pid 42 runs on 0000:1a:00.0"
        );
        let esc = json!({"error": {"code": "X", "message": "a\u{1b}[2J"}});
        assert_eq!(
            failure_line("c", "failed", &esc),
            "command c failed: X: a\\u{1b}[2J"
        );
        assert_eq!(
            failure_line("c", "expired", &json!({})),
            "command c expired"
        );
    }
}
