//! Running an external tool (`nvidia-smi`) with a time limit.

use std::io::Read;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long to wait for a tool's pipes to close after it exited or was killed (a grandchild may
/// hold them open).
const PIPE_GRACE: Duration = Duration::from_secs(1);

/// A finished (or killed) tool run.
#[derive(Debug)]
pub(crate) struct ToolRun {
    /// Exit status; `None` when it was killed for running past the timeout.
    pub status: Option<ExitStatus>,
    /// Stdout then stderr, plus a note when it was killed.
    pub text: String,
}

impl ToolRun {
    /// Exited with status 0.
    pub fn success(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }

    /// The exit code, if it exited.
    pub fn code(&self) -> Option<i32> {
        self.status.and_then(|s| s.code())
    }
}

/// Reads `pipe` to its end on a thread; the bytes arrive on the returned channel.
fn drain(pipe: Option<impl Read + Send + 'static>) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_end(&mut buf);
        }
        let _ = tx.send(buf);
    });
    rx
}

/// Runs `cmd` with stdin closed, collecting its output, and kills it after `timeout`.
pub(crate) fn run_with_timeout(mut cmd: Command, timeout: Duration) -> std::io::Result<ToolRun> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    // Both pipes are read on their own threads so a chatty tool never blocks on a full pipe.
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break Some(s);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut text =
        String::from_utf8_lossy(&out.recv_timeout(PIPE_GRACE).unwrap_or_default()).into_owned();
    text.push_str(&String::from_utf8_lossy(
        &err.recv_timeout(PIPE_GRACE).unwrap_or_default(),
    ));
    if status.is_none() {
        text.push_str(&format!("\n(killed after {} s)\n", timeout.as_secs()));
    }
    Ok(ToolRun { status, text })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_hung_tool_is_killed_at_the_timeout() {
        let mut cmd = Command::new("/bin/sh");
        // A grandchild that keeps the pipes open must not hold us up either.
        cmd.args(["-c", "echo started; sleep 30"]);
        let run = run_with_timeout(cmd, Duration::from_millis(200)).unwrap();
        assert!(run.status.is_none());
        assert!(!run.success());
        assert!(run.text.contains("killed after"), "{}", run.text);
    }

    #[test]
    fn output_and_exit_code_are_collected() {
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", "echo out; echo err >&2; exit 3"]);
        let run = run_with_timeout(cmd, Duration::from_secs(30)).unwrap();
        assert_eq!((run.code(), run.text.as_str()), (Some(3), "out\nerr\n"));
    }
}
