//! Shell completions and man pages generated from a binary's clap `Command` (`bcd completions
//! bash`, `bcctl man --out-dir DIR`), so neither is written by hand and both follow the flags
//! as they change. `packaging/deb/build.sh` runs them and the Debian packages install the
//! results.

use std::io::Write;
use std::path::{Path, PathBuf};

pub use clap_complete::Shell;

/// `completions SHELL`: the script goes to stdout.
#[derive(Debug, Clone, clap::Args)]
pub struct CompletionsArgs {
    /// The shell to complete for: bash, zsh, fish, elvish or powershell.
    #[arg(value_enum)]
    pub shell: Shell,
}

/// `man --out-dir DIR`: one page per command and subcommand.
#[derive(Debug, Clone, clap::Args)]
pub struct ManArgs {
    /// Directory the pages are written into (created if missing): `NAME.1`, and
    /// `NAME-SUBCOMMAND.1` for every visible subcommand, as roff.
    #[arg(long)]
    pub out_dir: PathBuf,
}

/// What went wrong writing completions or man pages.
#[derive(Debug, thiserror::Error)]
pub enum CliDocsError {
    /// The output directory could not be created or a page could not be written.
    #[error("writing man pages into {dir}: {source}")]
    Man {
        dir: PathBuf,
        source: std::io::Error,
    },
    /// The completion script could not be written (a closed pipe, a full disk).
    #[error("writing the completion script: {0}")]
    Completions(std::io::Error),
}

/// Writes `shell`'s completion script for `cmd` (named by its `name`) to `out`.
pub fn completions(
    mut cmd: clap::Command,
    shell: Shell,
    out: &mut dyn Write,
) -> Result<(), CliDocsError> {
    let name = cmd.get_name().to_owned();
    // clap_complete writes through `Write` and panics on nothing; collect first so an I/O error
    // comes back as an error instead of a half-written script.
    let mut buf = Vec::new();
    clap_complete::generate(shell, &mut cmd, name, &mut buf);
    out.write_all(&buf)
        .and_then(|()| out.flush())
        .map_err(CliDocsError::Completions)
}

/// Writes a man page (section 1) for `cmd` and each visible subcommand into `dir`; returns the
/// `.1` files `dir` then holds, sorted.
pub fn man_pages(cmd: clap::Command, dir: &Path) -> Result<Vec<PathBuf>, CliDocsError> {
    let err = |source| CliDocsError::Man {
        dir: dir.to_owned(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(err)?;
    clap_mangen::generate_to(cmd, dir).map_err(err)?;
    let mut pages = pages_in(dir).map_err(err)?;
    pages.sort();
    Ok(pages)
}

fn pages_in(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "1") {
            out.push(p);
        }
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn cmd() -> clap::Command {
        clap::Command::new("demo")
            .version("1.2.3")
            .about("a demo")
            .arg(clap::Arg::new("log").long("log").help("Log filter"))
            .subcommand(
                clap::Command::new("agent")
                    .about("run the agent")
                    .arg(clap::Arg::new("state-dir").long("state-dir")),
            )
            .subcommand(clap::Command::new("internal").hide(true))
    }

    #[test]
    fn bash_completion_names_the_subcommands_and_their_flags() {
        let mut out = Vec::new();
        completions(cmd(), Shell::Bash, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("complete -F _demo"), "{text}");
        assert!(text.contains("agent"), "{text}");
        assert!(text.contains("--state-dir"), "{text}");
        assert!(
            !text.contains("secret"),
            "hidden subcommands stay hidden: {text}"
        );
    }

    #[test]
    fn a_page_per_visible_command_with_its_flags() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("man");
        let pages = man_pages(cmd(), &out).unwrap();
        let names: Vec<_> = pages
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        // Hidden subcommands get no page.
        assert_eq!(names, ["demo-agent.1", "demo.1"]);
        let agent = std::fs::read_to_string(out.join("demo-agent.1")).unwrap();
        assert!(agent.starts_with(".ie \\n(.g .ds Aq"), "roff: {agent}");
        assert!(agent.contains("state\\-dir"), "{agent}");
    }

    #[test]
    fn an_unwritable_directory_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a-file");
        std::fs::write(&file, "x").unwrap();
        let e = man_pages(cmd(), &file.join("man")).unwrap_err();
        assert!(e.to_string().contains("a-file/man"), "{e}");
    }
}
