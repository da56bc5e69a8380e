//! The tracing subscriber of `bcd` and `bcctl`: human-readable lines on stderr (journald keeps
//! stderr of a unit), filtered by an `EnvFilter` directive string, coloured only when stderr is a
//! terminal.

/// Installs the global subscriber for `filter` (tracing `EnvFilter` syntax, e.g.
/// `info,bcd=debug`). A filter that does not parse falls back to `info` rather than leaving the
/// process silent. Call once, first thing in `main`; a second call panics inside
/// tracing-subscriber, as installing two global subscribers is a programming error.
pub fn init(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// [`init`], with every line also appended to `file` (without colours): the ramdisk has no
/// journal, and `logs.collect` reads the agent's own log from there. When `file` cannot be
/// opened nothing is installed and the error is returned; the caller falls back to [`init`].
pub fn init_with_file(filter: &str, file: &std::path::Path) -> std::io::Result<()> {
    use tracing_subscriber::fmt::writer::MakeWriterExt;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(file)?;
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr.and(std::sync::Arc::new(f)))
        .with_ansi(false)
        .init();
    Ok(())
}
