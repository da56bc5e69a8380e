//! What `bcctl serve` leaves on disk is private whatever the umask (state dir 0700, `state.db`
//! 0600), and a start-up failure names the file it failed on.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use controlplane_lite::server::{ServeConfig, start};

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

fn config(dir: &Path) -> ServeConfig {
    let any = "127.0.0.1:0".parse().unwrap();
    ServeConfig::new(dir.to_owned(), any, any)
}

#[tokio::test]
async fn the_state_dir_and_the_store_are_private() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    // A state dir someone made world-readable.
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let running = start(config(&dir)).await.unwrap();
    assert_eq!(mode(&dir), 0o700, "state dir");
    assert_eq!(mode(&dir.join("state.db")), 0o600, "state.db");
    assert_eq!(mode(&dir.join("api-token")), 0o600, "api-token");
    running.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_store_that_cannot_be_opened_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    // state.db is not a database (a torn copy, another file put in its place): SQLite's own
    // message names no file.
    std::fs::write(tmp.path().join("state.db"), vec![0x5a; 8192]).unwrap();
    let err = start(config(tmp.path()))
        .await
        .expect_err("start must fail");
    let text = bc_net::report::error_chain(&err);
    assert!(
        text.contains(&tmp.path().join("state.db").display().to_string()),
        "{text}"
    );
}
