//! kubectl's connection flags before the subcommand.
//!
//! kubectl hands a plugin its arguments exactly as typed, and kubectl users put connection flags
//! where cobra lets them: `kubectl helmop --context prod status`. clap only accepts a subcommand's
//! flags after its name, and helmop's subcommands differ in which of these flags they take (`-A`
//! means nothing to `rollout`). So instead of making them global, the flags typed before the
//! subcommand are moved right behind it, and the subcommand's own definition decides, with its own
//! error for one it does not take.

use std::ffi::OsString;

/// The flags that move, and whether each takes a value.
const CONNECTION_FLAGS: &[(&str, bool)] = &[
    ("--kubeconfig", true),
    ("--context", true),
    ("--namespace", true),
    ("-n", true),
    ("--request-timeout", true),
    ("--all-namespaces", false),
    ("-A", false),
];

/// `args` without the program name, with the connection flags found before the subcommand moved
/// right behind it. Anything else before the subcommand (`--help`, an unknown flag, a flag whose
/// value is missing) leaves `args` untouched, so clap reports it as it always did.
pub fn hoist_connection_flags(args: Vec<OsString>) -> Vec<OsString> {
    let mut hoisted = Vec::new();
    let mut i = 0;
    while let Some(arg) = args.get(i) {
        let Some(text) = arg.to_str() else {
            return args;
        };
        if !text.starts_with('-') {
            break;
        }
        match connection_flag(text) {
            Some(Flag::Complete) => {
                hoisted.push(arg.clone());
                i += 1;
            }
            Some(Flag::NeedsValue) => match args.get(i + 1) {
                Some(value) => {
                    hoisted.push(arg.clone());
                    hoisted.push(value.clone());
                    i += 2;
                }
                None => return args,
            },
            None => return args,
        }
    }
    if hoisted.is_empty() || i >= args.len() {
        return args;
    }
    let mut out = Vec::with_capacity(args.len());
    out.push(args[i].clone());
    out.extend(hoisted);
    out.extend(args[i + 1..].iter().cloned());
    out
}

/// The same for words that are not `OsString`s (the completion protocol's).
pub fn hoist_connection_words(words: Vec<String>) -> Vec<String> {
    let os = words.iter().map(OsString::from).collect();
    hoist_connection_flags(os)
        .into_iter()
        .map(|w| w.to_string_lossy().into_owned())
        .collect()
}

enum Flag {
    /// A switch, or a flag with its value attached (`--context=prod`, `-nprod`).
    Complete,
    /// A flag whose value is the next argument.
    NeedsValue,
}

fn connection_flag(arg: &str) -> Option<Flag> {
    for &(name, takes_value) in CONNECTION_FLAGS {
        if arg == name {
            return Some(if takes_value {
                Flag::NeedsValue
            } else {
                Flag::Complete
            });
        }
        if !takes_value {
            continue;
        }
        let attached = if name.starts_with("--") {
            arg.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('='))
        } else {
            // `-nprod` and `-n=prod`, as clap and cobra read short flags.
            arg.strip_prefix(name).is_some_and(|rest| !rest.is_empty())
        };
        if attached {
            return Some(Flag::Complete);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hoist(args: &[&str]) -> Vec<String> {
        hoist_connection_words(args.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn flags_before_the_subcommand_move_behind_it_in_order() {
        assert_eq!(
            hoist(&[
                "--context",
                "prod",
                "-n",
                "apps",
                "status",
                "web",
                "-o",
                "json"
            ]),
            [
                "status",
                "--context",
                "prod",
                "-n",
                "apps",
                "web",
                "-o",
                "json"
            ]
        );
        assert_eq!(
            hoist(&[
                "--kubeconfig=/k",
                "-A",
                "--request-timeout",
                "5s",
                "propagate"
            ]),
            [
                "propagate",
                "--kubeconfig=/k",
                "-A",
                "--request-timeout",
                "5s"
            ]
        );
        assert_eq!(
            hoist(&["-nfleet-default", "--all-namespaces", "prune", "--dry-run"]),
            ["prune", "-nfleet-default", "--all-namespaces", "--dry-run"]
        );
        assert_eq!(
            hoist(&["--namespace=apps", "rollout", "deploy/web"]),
            ["rollout", "--namespace=apps", "deploy/web"]
        );
    }

    #[test]
    fn anything_else_is_left_for_clap_to_judge() {
        for args in [
            &["status", "--context", "prod"][..],
            &["--help", "status"],
            &["--context", "prod", "--version"],
            &["--contextx", "prod", "status"],
            &["--context"],
            &["--context", "prod"],
            &["-o", "json", "status"],
            &["-A"],
            &[],
        ] {
            assert_eq!(hoist(args), args, "{args:?}");
        }
    }

    #[test]
    fn a_value_that_looks_like_a_subcommand_stays_a_value() {
        assert_eq!(
            hoist(&["--context", "status", "status"]),
            ["status", "--context", "status"]
        );
    }
}
