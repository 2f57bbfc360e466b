//! Turning `-f FILE|DIR|-` arguments into named byte buffers.

use std::collections::HashSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::PluginError;

/// Extensions picked up when walking a directory (explicit files are read whatever their name).
const EXTENSIONS: &[&str] = &["yaml", "yml", "json"];

/// One input: where it came from and its bytes, or why it could not be read.
#[derive(Debug)]
pub struct Input {
    /// The path as the user would recognise it, or `-` for stdin.
    pub name: String,
    pub content: Result<Vec<u8>, PluginError>,
}

/// Expands the arguments in order: files as given, directories recursively (sorted, so output
/// is stable), `-` as stdin (read once).
pub fn collect(args: &[PathBuf], stdin: &mut dyn Read) -> Vec<Input> {
    let mut out = Vec::new();
    let mut stdin_used = false;
    for arg in args {
        if arg.as_os_str() == "-" {
            if stdin_used {
                continue;
            }
            stdin_used = true;
            let mut buf = Vec::new();
            let content = stdin
                .read_to_end(&mut buf)
                .map(|_| buf)
                .map_err(|e| PluginError::ReadStdin(Arc::new(e)));
            out.push(Input {
                name: "-".into(),
                content,
            });
            continue;
        }
        match std::fs::metadata(arg) {
            Ok(meta) if meta.is_dir() => {
                let before = out.len();
                let mut visited = HashSet::new();
                walk(arg, &mut out, &mut visited);
                if out.len() == before {
                    out.push(Input {
                        name: arg.display().to_string(),
                        content: Err(PluginError::NoManifests),
                    });
                }
            }
            Ok(_) => out.push(read(arg)),
            Err(e) => out.push(Input {
                name: arg.display().to_string(),
                content: Err(PluginError::ReadFile(Arc::new(e))),
            }),
        }
    }
    out
}

fn read(path: &Path) -> Input {
    Input {
        name: path.display().to_string(),
        content: std::fs::read(path).map_err(|e| PluginError::ReadFile(Arc::new(e))),
    }
}

fn walk(dir: &Path, out: &mut Vec<Input>, visited: &mut HashSet<PathBuf>) {
    // Symlinked directories are followed once; a cycle would otherwise never end.
    match std::fs::canonicalize(dir) {
        Ok(real) => {
            if !visited.insert(real) {
                return;
            }
        }
        Err(e) => {
            out.push(Input {
                name: dir.display().to_string(),
                content: Err(PluginError::ReadDirectory(Arc::new(e))),
            });
            return;
        }
    }
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => {
            out.push(Input {
                name: dir.display().to_string(),
                content: Err(PluginError::ReadDirectory(Arc::new(e))),
            });
            return;
        }
    };
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for path in paths {
        match std::fs::metadata(&path) {
            Ok(meta) if meta.is_dir() => walk(&path, out, visited),
            Ok(_) if has_manifest_extension(&path) => out.push(read(&path)),
            Ok(_) => {}
            // A dangling symlink with a manifest name is worth mentioning; other junk is not.
            Err(e) if has_manifest_extension(&path) => out.push(Input {
                name: path.display().to_string(),
                content: Err(PluginError::ReadFile(Arc::new(e))),
            }),
            Err(_) => {}
        }
    }
}

fn has_manifest_extension(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| EXTENSIONS.iter().any(|x| e.eq_ignore_ascii_case(x)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(inputs: &[Input]) -> Vec<String> {
        inputs.iter().map(|i| i.name.clone()).collect()
    }

    #[test]
    fn walks_directories_recursively_and_sorted() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("b/c")).unwrap();
        std::fs::write(root.join("z.yaml"), "a: 1").unwrap();
        std::fs::write(root.join("a.YML"), "a: 1").unwrap();
        std::fs::write(root.join("b/c/d.json"), "{}").unwrap();
        std::fs::write(root.join("b/readme.md"), "no").unwrap();
        let got = collect(&[root.to_path_buf()], &mut std::io::empty());
        let rel: Vec<String> = names(&got)
            .iter()
            .map(|n| {
                n.strip_prefix(&root.display().to_string())
                    .unwrap()
                    .to_string()
            })
            .collect();
        assert_eq!(rel, ["/a.YML", "/b/c/d.json", "/z.yaml"]);
        assert!(got.iter().all(|i| i.content.is_ok()));
    }

    #[test]
    fn explicit_files_need_no_extension_and_stdin_is_read_once() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("helmop.txt");
        std::fs::write(&f, "kind: HelmOp").unwrap();
        let mut stdin: &[u8] = b"from stdin";
        let got = collect(&[f.clone(), "-".into(), "-".into()], &mut stdin);
        assert_eq!(names(&got), [f.display().to_string(), "-".to_string()]);
        assert_eq!(got[1].content.as_deref().unwrap(), b"from stdin");
    }

    #[test]
    fn problems_are_inputs_with_errors() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        let missing = dir.path().join("missing.yaml");
        let got = collect(&[missing, empty], &mut std::io::empty());
        assert_eq!(got.len(), 2);
        assert!(
            got[0]
                .content
                .as_ref()
                .unwrap_err()
                .to_string()
                .starts_with("cannot read:")
        );
        assert!(
            got[1]
                .content
                .as_ref()
                .unwrap_err()
                .to_string()
                .contains("no *.yaml")
        );
    }

    #[cfg(unix)]
    #[test]
    fn symlink_cycles_terminate() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("a.yaml"), "a: 1").unwrap();
        std::os::unix::fs::symlink(root, root.join("loop")).unwrap();
        let got = collect(&[root.to_path_buf()], &mut std::io::empty());
        assert_eq!(got.len(), 1);
    }
}
