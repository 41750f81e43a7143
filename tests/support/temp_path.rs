//! A path under the temporary directory that is removed when the test
//! ends, pass or fail: one copy for the test suites of every crate, each
//! including it with `#[path = ".../tests/support/temp_path.rs"] mod
//! temp_path;` (test binaries share no crate of their own).
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// `<temp dir>/<prefix>-<pid>-<name>`: a file or a folder, removed on drop.
pub struct TempPath(PathBuf);

impl TempPath {
    /// The path, with nothing there (a leftover of the same name removed).
    pub fn new(prefix: &str, name: &str) -> TempPath {
        let p = std::env::temp_dir().join(format!("{prefix}-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        let _ = std::fs::remove_file(&p);
        TempPath(p)
    }

    /// [`TempPath::new`] made an empty folder.
    pub fn dir(prefix: &str, name: &str) -> TempPath {
        let t = TempPath::new(prefix, name);
        std::fs::create_dir_all(&t.0).unwrap();
        t
    }
}

impl std::ops::Deref for TempPath {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for TempPath {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for TempPath {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = match self.0.is_dir() {
            true => std::fs::remove_dir_all(&self.0),
            false => std::fs::remove_file(&self.0),
        };
    }
}
