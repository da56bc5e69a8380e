//! One run of `qemu-img` whose source image is [`Served`], exported over NBD on a Unix socket
//! in a fresh temporary folder: the child connects once, is served until it disconnects, and
//! is killed if serving fails (its read was answered `EIO`; it need not be believed to stop).

use std::io::Read;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::super::DeployError;
use super::super::nbd;
use super::served::Served;

/// The converter's name (Debian: qemu-utils).
pub const QEMU_IMG: &str = "qemu-img";
/// Where Debian and the ramdisk (`packaging/ramdisk/build.sh`) put it; else it is looked up
/// on `PATH` (the ramdisk's is `/bin`).
const QEMU_IMG_PATH: &str = "/usr/bin/qemu-img";
/// The largest NBD read served, bytes (the export's announced maximum block size).
const MAX_READ_BYTES: u32 = 4 << 20;
/// How long `qemu-img` may take to connect after it started, ms.
const CONNECT_TIMEOUT_MS: u64 = 30_000;
/// How often the wait for its connection looks at the child, ms.
const POLL_MS: u64 = 10;
/// Bytes of its stdout (the `info` JSON) and stderr kept.
const OUTPUT_LIMIT_BYTES: u64 = 1 << 20;

fn failed(why: String) -> DeployError {
    DeployError::Qcow2(why)
}

/// The `json:` filename of the source: qcow2 over NBD on `socket`, with no backing file (a
/// backing file named in the image would be opened from the ramdisk's own filesystem).
pub fn source_filename(socket: &Path) -> String {
    let spec = serde_json::json!({
        "driver": "qcow2",
        "backing": null,
        "file": {
            "driver": "nbd",
            "server": {"type": "unix", "path": socket.to_string_lossy()},
        },
    });
    format!("json:{spec}")
}

/// Runs `qemu-img <args>`, each `{source}` in `args` replaced by the source's filename; its
/// stdout on success.
pub fn run(args: &[&str], served: &mut Served) -> Result<Vec<u8>, DeployError> {
    let dir = tempfile::Builder::new()
        .prefix("bcd-qcow2-")
        .tempdir()
        .map_err(|e| failed(format!("a temporary folder for the NBD socket: {e}")))?;
    let socket = dir.path().join("nbd.sock");
    let listener = UnixListener::bind(&socket).map_err(|e| failed(format!("NBD socket: {e}")))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| failed(format!("NBD socket: {e}")))?;
    let source = source_filename(&socket);
    let args: Vec<&str> = args
        .iter()
        .map(|a| if *a == "{source}" { source.as_str() } else { a })
        .collect();
    let verb = args.first().copied().unwrap_or("");
    let program = if Path::new(QEMU_IMG_PATH).exists() {
        QEMU_IMG_PATH
    } else {
        QEMU_IMG
    };
    let mut child = Command::new(program)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                failed(format!(
                    "{QEMU_IMG} is not installed (Debian package qemu-utils); this ramdisk \
                     cannot write qcow2 images"
                ))
            } else {
                failed(format!("starting {QEMU_IMG}: {e}"))
            }
        })?;
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    std::thread::scope(|s| {
        let out = s.spawn(move || collect(stdout));
        let err = s.spawn(move || collect(stderr));
        let served_result = serve(&listener, &mut child, served);
        if served_result.is_err() {
            // Already gone is fine: the wait below reaps it either way.
            let _ = child.kill();
        }
        let status = child.wait();
        let (out, err) = (
            out.join().unwrap_or_default(),
            err.join().unwrap_or_default(),
        );
        if let Some(f) = served.failure.take() {
            return Err(f);
        }
        served_result?;
        let status = status.map_err(|e| failed(format!("waiting for {QEMU_IMG}: {e}")))?;
        if !status.success() {
            let said = String::from_utf8_lossy(&err);
            let said = said.trim().replace(&source, "<image>");
            return Err(failed(format!(
                "{QEMU_IMG} {verb} failed ({status}): {said}"
            )));
        }
        Ok(out)
    })
}

/// Waits for the child's connection and serves it; `Ok` also when the child exited first
/// (its status says why).
fn serve(
    listener: &UnixListener,
    child: &mut Child,
    served: &mut Served,
) -> Result<(), DeployError> {
    let started = Instant::now();
    let mut sock = loop {
        match listener.accept() {
            Ok((sock, _)) => break sock,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if child.try_wait().ok().flatten().is_some() {
                    return Ok(());
                }
                if started.elapsed() > Duration::from_millis(CONNECT_TIMEOUT_MS) {
                    return Err(failed(format!(
                        "{QEMU_IMG} did not connect to the NBD socket in {CONNECT_TIMEOUT_MS} ms"
                    )));
                }
                std::thread::sleep(Duration::from_millis(POLL_MS));
            }
            Err(e) => return Err(failed(format!("NBD socket: accept: {e}"))),
        }
    };
    sock.set_nonblocking(false)
        .map_err(|e| failed(format!("NBD socket: {e}")))?;
    nbd::serve(&mut sock, served, MAX_READ_BYTES)
        .map_err(|e| failed(format!("serving the image to {QEMU_IMG}: {e}")))
}

fn collect(from: Option<impl Read>) -> Vec<u8> {
    let mut out = Vec::new();
    if let Some(r) = from {
        // What could not be read is simply not shown.
        let _ = r.take(OUTPUT_LIMIT_BYTES).read_to_end(&mut out);
    }
    out
}
