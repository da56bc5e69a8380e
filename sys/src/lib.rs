//! bc-sys: the operating-system plumbing both binaries (`bcd`, `bcctl`) need, one of each.
//!
//! # Background
//! The node daemon and the control plane each grew their own copy of the same three things: a
//! temp-file-and-rename write (one fsynced the directory, one did not; three more were written
//! out by hand), a tracing subscriber setup, and systemd's notify protocol (hand-rolled in the
//! daemon, the `sd-notify` crate in `bcctl`). Copies drift; this crate holds the one version.
//!
//! # Design
//! - [`atomic`]: [`atomic::write`] — temp file in the target's directory (mode bits set when it
//!   is created), write, fsync the file, rename over the target, fsync the directory.
//! - [`lockfile`]: [`lockfile::lock`] — one process per directory: an exclusive `flock(2)` on a
//!   lock file holding the holder's pid, kept for the process's life.
//! - [`logging`]: [`logging::init`] — the fmt subscriber on stderr with an `EnvFilter`, colours
//!   only on a terminal.
//! - [`notify`]: [`notify::Notifier`] — `READY=1`, `WATCHDOG=1`, `STATUS=`, `STOPPING=1` to
//!   `NOTIFY_SOCKET` (path or `@abstract`), and the watchdog interval and ping task.
//! - [`userfile`]: [`userfile::UserDir`] — the one rule for files a root process writes on a
//!   user's behalf (`~/.ssh/authorized_keys`, and every later caller): walked and opened by
//!   descriptor, no symlink a user could have made, one link, the user's or root's, bounded
//!   reads, atomic replacement with the user's ownership.
//! - [`cli_docs`]: [`cli_docs::completions`] and [`cli_docs::man_pages`] — shell completions and
//!   man pages from a binary's clap `Command` (both binaries' `completions` and `man`).
//!
//! # Limitations
//! Linux only (`AF_UNIX` abstract names, unix permission bits). Must not depend on any other
//! crate of this workspace: everything else may depend on it. No networking (that is `bc-net`).
#![forbid(unsafe_code)]

pub mod atomic;
pub mod cli_docs;
pub mod lockfile;
pub mod logging;
pub mod notify;
pub mod userfile;
