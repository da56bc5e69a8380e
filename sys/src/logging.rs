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
