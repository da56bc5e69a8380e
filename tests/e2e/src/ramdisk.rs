//! The real ramdisk image (`packaging/ramdisk/build.sh`), built for a test; [`crate::metal`]
//! boots it over PXE.
//!
//! Tools: those of [`crate::vm::VmTools`], plus `depmod`, `gzip` and `strip` for the build.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Instant;

use crate::vm::VmTools;

/// `packaging/ramdisk/build.sh` of this checkout.
pub fn build_script() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../packaging/ramdisk/build.sh"
    ))
}

/// [`crate::vm::tools_or_skip`], also requiring what `build.sh` runs.
pub fn tools_or_skip(test: &str) -> Option<VmTools> {
    let t = crate::vm::tools_or_skip(test)?;
    let missing = ["depmod", "gzip", "strip"].into_iter().find(|tool| {
        !Command::new("sh")
            .arg("-c")
            .arg(format!(
                "command -v {tool} || test -x /usr/sbin/{tool} || test -x /sbin/{tool}"
            ))
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    if let Some(tool) = missing {
        let m = format!("{tool} is not installed");
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{test}: cannot build the ramdisk: {m} (.ci/run installs it)"
        );
        eprintln!("!!! {test}: SKIPPED, cannot build the ramdisk: {m} (.ci/run installs it)");
        return None;
    }
    Some(t)
}

/// A built image.
#[derive(Debug)]
pub struct Image {
    /// `initrd.img` (gzip).
    pub initrd: PathBuf,
    /// `vmlinuz`, the kernel copied beside it.
    pub kernel: PathBuf,
    /// What build.sh printed (sizes, sha256).
    pub report: String,
}

/// Runs `build.sh` for `t`'s kernel and `bcd` into `out`.
pub fn build_image(t: &VmTools, bcd: &Path, out: &Path) -> Image {
    let started = Instant::now();
    let o = Command::new("bash")
        .arg(build_script())
        .arg("--kernel-root")
        .arg(&t.modules_root)
        .args(["--kernel-version", &t.kernel_version])
        .arg("--bcd")
        .arg(bcd)
        .arg("--busybox")
        .arg(&t.busybox)
        .arg("--out")
        .arg(out)
        .output()
        .expect("running build.sh");
    let report = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "build.sh failed ({}):\n{report}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    eprintln!(
        "ramdisk built in {:.1} s:\n{report}",
        started.elapsed().as_secs_f64()
    );
    Image {
        initrd: out.join("initrd.img"),
        kernel: out.join("vmlinuz"),
        report,
    }
}

/// `bcctl` and `bcd` of this checkout, built once (only those two binaries, not the whole
/// workspace: the VM tests need nothing else) and shared with [`crate::bins`] in this process.
pub fn bins() -> &'static (PathBuf, PathBuf) {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        crate::preset_bins(|dir, target| {
            let mut cmd = crate::cargo_command();
            cmd.args([
                "build",
                "-p",
                "bcd",
                "--bin",
                "bcd",
                "-p",
                "controlplane-lite",
                "--bin",
                "bcctl",
                "--target-dir",
            ])
            .arg(target)
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
            if dir.file_name().and_then(|n| n.to_str()) == Some("release") {
                cmd.arg("--release");
            }
            let status = cmd.status().expect("running cargo build");
            assert!(status.success(), "building bcd and bcctl failed");
        });
    });
    crate::bins()
}
