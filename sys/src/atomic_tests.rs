use std::fs;
use std::os::unix::fs::PermissionsExt;

use super::*;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn mode(p: &Path) -> std::io::Result<u32> {
    Ok(fs::metadata(p)?.permissions().mode() & 0o777)
}

#[test]
fn replaces_the_content_with_the_mode_asked_for() -> TestResult {
    let dir = tempfile::tempdir()?;
    let p = dir.path().join("key.pem");
    write(&p, b"first", 0o600)?;
    assert_eq!(fs::read(&p)?, b"first");
    assert_eq!(mode(&p)?, 0o600);
    write(&p, b"second, longer", 0o644)?;
    assert_eq!(fs::read(&p)?, b"second, longer");
    assert_eq!(mode(&p)?, 0o644);
    // Nothing but the target is left in the directory.
    let names: Vec<_> = fs::read_dir(dir.path())?
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(names, ["key.pem"]);
    Ok(())
}

#[test]
fn a_failed_write_leaves_the_target_and_no_temp_file() -> TestResult {
    let dir = tempfile::tempdir()?;
    // The target is a directory: the rename fails after the temp file was written.
    let target = dir.path().join("taken");
    fs::create_dir(&target)?;
    fs::write(target.join("inside"), b"x")?;
    let err = write(&target, b"data", 0o644)
        .err()
        .ok_or("rename over a directory worked")?;
    assert_eq!(err.step, Step::Rename);
    assert!(err.to_string().contains("taken"), "{err}");
    assert!(target.join("inside").is_file());
    let names: Vec<_> = fs::read_dir(dir.path())?
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(names, ["taken"]);
    // A directory that does not exist is an error naming the step, not a panic.
    let err = write(&dir.path().join("no/such/file"), b"x", 0o600)
        .err()
        .ok_or("wrote into a missing directory")?;
    assert_eq!(err.step, Step::Create);
    Ok(())
}
