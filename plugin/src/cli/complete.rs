//! Dynamic shell completion in Cobra's `__complete` protocol, which kubectl (>= 1.26) speaks with
//! plugins: on `kubectl helmop status we<TAB>` it runs `kubectl_complete-helmop status we` and reads
//! one candidate per line (`value<TAB>description`), then a last line `:<directive>`.
//!
//! `kubectl_complete-helmop` (the second binary of this crate) only forwards its arguments to
//! `kubectl-helmop __complete`, so the command definition below is the single source of truth.
//! Words are matched against the clap definition ([`analyse`], pure); values that live in a cluster
//! or a kubeconfig (HelmOp names, namespaces, contexts, workloads) come from a [`Lookup`].

use clap::{Arg, Command};
use helmop_core::workload::WorkloadKind;

use crate::run::workload_ref::{canonical, parse_kind, rollout_kinds};

/// Cobra's `ShellCompDirective` bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Directive(pub u32);

impl Directive {
    /// Let the shell complete file names as well.
    pub const DEFAULT: Directive = Directive(0);
    /// Do not add a space after the completion (e.g. after `deployment/`).
    pub const NO_SPACE: Directive = Directive(2);
    /// Do not fall back to file names.
    pub const NO_FILE_COMP: Directive = Directive(4);

    pub fn with(self, other: Directive) -> Directive {
        Directive(self.0 | other.0)
    }
}

/// One completion choice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub value: String,
    pub help: Option<String>,
}

impl Candidate {
    fn new(value: impl Into<String>, help: Option<String>) -> Candidate {
        Candidate {
            value: value.into(),
            help,
        }
    }
}

/// The answer to one completion request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    pub candidates: Vec<Candidate>,
    pub directive: Directive,
}

impl Completion {
    /// The protocol's text: candidates (tab, first line of the description), then `:<directive>`.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for c in &self.candidates {
            out.push_str(&c.value);
            if let Some(help) = c
                .help
                .as_deref()
                .and_then(|h| h.lines().next())
                .filter(|h| !h.is_empty())
            {
                out.push('\t');
                out.push_str(help);
            }
            out.push('\n');
        }
        out.push(':');
        out.push_str(&self.directive.0.to_string());
        out.push('\n');
        out
    }
}

/// What kind of value a slot holds, from its value name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueKind {
    HelmOp,
    Namespace,
    Context,
    Workload,
    /// A file or directory: the shell completes it.
    Path,
    Other,
}

fn value_kind(arg: &Arg) -> ValueKind {
    use clap::ValueHint;
    match arg.get_value_hint() {
        ValueHint::FilePath | ValueHint::DirPath | ValueHint::AnyPath => return ValueKind::Path,
        _ => {}
    }
    let names: Vec<String> = arg
        .get_value_names()
        .unwrap_or_default()
        .iter()
        .map(|n| n.to_ascii_uppercase())
        .collect();
    let id = arg.get_id().as_str();
    let has = |s: &str| names.iter().any(|n| n == s);
    if has("HELMOP") || id == "helmop" {
        ValueKind::HelmOp
    } else if has("NAMESPACE") || has("NS") || id == "namespace" {
        ValueKind::Namespace
    } else if has("CONTEXT") || has("CTX") || id == "context" || id == "target_context" {
        ValueKind::Context
    } else if has("KIND/NAME") {
        ValueKind::Workload
    } else if names
        .iter()
        .any(|n| n.contains("FILE") || n.contains("DIR"))
        || id == "kubeconfig"
    {
        ValueKind::Path
    } else {
        ValueKind::Other
    }
}

/// Where the word being completed stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Slot {
    /// A flag name (`-`/`--` typed).
    Flag,
    /// The value of the flag with this id; `prefix` is what precedes the value in the word
    /// (`--output=`), empty when the value is a word of its own.
    FlagValue { arg: String, prefix: String },
    /// A subcommand or the positional argument with this index.
    Word { position: usize },
}

/// The words of a command line, read against the command definition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Analysis {
    /// Subcommand names from the root, e.g. `["rollout"]`.
    pub path: Vec<String>,
    /// Flag values seen, by arg id (`namespace`, `context`, `kubeconfig`), in order.
    pub values: Vec<(String, String)>,
    /// Flags without value seen, by arg id (`all_namespaces`).
    pub switches: Vec<String>,
    pub positionals: Vec<String>,
    pub slot: Slot,
    /// The (partial) word being completed.
    pub partial: String,
}

impl Analysis {
    /// Last value given for the flag with this id.
    pub fn value(&self, id: &str) -> Option<&str> {
        self.values
            .iter()
            .rev()
            .find(|(k, _)| k == id)
            .map(|(_, v)| v.as_str())
    }
}

/// Walks `words` (the last one is the partial word, possibly empty) through `root`, which must have
/// been built (`Command::build`) so global flags are visible in subcommands.
pub fn analyse(root: &Command, words: &[String]) -> Analysis {
    let (partial, done) = match words.split_last() {
        Some((last, done)) => (last.clone(), done),
        None => (String::new(), &[][..]),
    };
    let mut cmd = root;
    let mut a = Analysis {
        path: Vec::new(),
        values: Vec::new(),
        switches: Vec::new(),
        positionals: Vec::new(),
        slot: Slot::Flag,
        partial: partial.clone(),
    };
    let mut pending: Option<String> = None;
    let mut only_positionals = false;
    for word in done {
        if let Some(id) = pending.take() {
            a.values.push((id, word.clone()));
            continue;
        }
        if !only_positionals && word == "--" {
            only_positionals = true;
            continue;
        }
        if !only_positionals && word.starts_with("--") {
            let (name, value) = match word[2..].split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (&word[2..], None),
            };
            if let Some(arg) = find_long(cmd, name) {
                record(&mut a, &mut pending, arg, value.map(str::to_owned));
            }
            continue;
        }
        if !only_positionals && word.starts_with('-') && word.len() > 1 {
            // A cluster of short flags; the first one taking a value eats the rest (`-nprod`).
            for (i, c) in word.char_indices().skip(1) {
                let Some(arg) = find_short(cmd, c) else { break };
                if takes_value(arg) {
                    let rest = &word[i + c.len_utf8()..];
                    let rest = rest.strip_prefix('=').unwrap_or(rest);
                    let value = (!rest.is_empty()).then(|| rest.to_owned());
                    record(&mut a, &mut pending, arg, value);
                    break;
                }
                a.switches.push(arg.get_id().as_str().to_owned());
            }
            continue;
        }
        if let Some(sub) = find_subcommand(cmd, word).filter(|_| a.positionals.is_empty()) {
            a.path.push(sub.get_name().to_owned());
            cmd = sub;
            continue;
        }
        a.positionals.push(word.clone());
    }
    a.slot = if let Some(arg) = pending {
        Slot::FlagValue {
            arg,
            prefix: String::new(),
        }
    } else if let Some(rest) = partial.strip_prefix("--").filter(|_| !only_positionals) {
        match rest.split_once('=') {
            Some((name, _)) => match find_long(cmd, name) {
                Some(arg) if takes_value(arg) => Slot::FlagValue {
                    arg: arg.get_id().as_str().to_owned(),
                    prefix: format!("--{name}="),
                },
                _ => Slot::Flag,
            },
            None => Slot::Flag,
        }
    } else if partial.starts_with('-') && !only_positionals {
        Slot::Flag
    } else {
        Slot::Word {
            position: a.positionals.len(),
        }
    };
    a
}

fn record(a: &mut Analysis, pending: &mut Option<String>, arg: &Arg, value: Option<String>) {
    let id = arg.get_id().as_str().to_owned();
    if !takes_value(arg) {
        a.switches.push(id);
    } else if let Some(v) = value {
        a.values.push((id, v));
    } else {
        *pending = Some(id);
    }
}

fn takes_value(arg: &Arg) -> bool {
    arg.get_action().takes_values()
}

fn find_long<'c>(cmd: &'c Command, name: &str) -> Option<&'c Arg> {
    cmd.get_arguments().find(|a| {
        a.get_long() == Some(name)
            || a.get_all_aliases()
                .is_some_and(|aliases| aliases.contains(&name))
    })
}

fn find_short(cmd: &Command, c: char) -> Option<&Arg> {
    cmd.get_arguments().find(|a| {
        a.get_short() == Some(c)
            || a.get_all_short_aliases()
                .is_some_and(|aliases| aliases.contains(&c))
    })
}

fn find_subcommand<'c>(cmd: &'c Command, name: &str) -> Option<&'c Command> {
    cmd.get_subcommands()
        .find(|s| s.get_name() == name || s.get_all_aliases().any(|a| a == name))
}

fn command_at<'c>(root: &'c Command, path: &[String]) -> &'c Command {
    let mut cmd = root;
    for name in path {
        match find_subcommand(cmd, name) {
            Some(sub) => cmd = sub,
            None => break,
        }
    }
    cmd
}

/// Values only a cluster or the kubeconfig knows. Implementations return what they can within a
/// short time and nothing on error: completion must never hang a shell or print errors into it.
pub trait Lookup {
    fn contexts(&self, a: &Analysis) -> Vec<String>;
    fn namespaces(&self, a: &Analysis) -> Vec<String>;
    fn helmops(&self, a: &Analysis) -> Vec<String>;
    fn workloads(&self, a: &Analysis, kind: WorkloadKind) -> Vec<String>;
}

/// The completion for `words`, against `root` (built) and `lookup`.
pub fn complete(root: &Command, words: &[String], lookup: &dyn Lookup) -> Completion {
    let a = analyse(root, words);
    let cmd = command_at(root, &a.path);
    let mut directive = Directive::NO_FILE_COMP;
    let mut candidates = Vec::new();
    match &a.slot {
        Slot::Flag => {
            for arg in cmd.get_arguments() {
                if arg.is_hide_set() || arg.is_positional() {
                    continue;
                }
                let help = arg.get_help().map(|h| h.to_string());
                if let Some(long) = arg.get_long() {
                    candidates.push(Candidate::new(format!("--{long}"), help));
                } else if let Some(short) = arg.get_short() {
                    candidates.push(Candidate::new(format!("-{short}"), help));
                }
            }
        }
        Slot::FlagValue { arg, prefix } => {
            if let Some(arg) = cmd.get_arguments().find(|x| x.get_id().as_str() == arg) {
                let (values, d) = values_for(arg, &a, lookup);
                directive = d;
                candidates = values
                    .into_iter()
                    .map(|c| Candidate::new(format!("{prefix}{}", c.value), c.help))
                    .collect();
            }
        }
        Slot::Word { position } => {
            if *position == 0 {
                for sub in cmd.get_subcommands() {
                    if !sub.is_hide_set() && sub.get_name() != "help" {
                        let help = sub.get_about().map(|h| h.to_string());
                        candidates.push(Candidate::new(sub.get_name(), help));
                    }
                }
            }
            let mut positionals: Vec<&Arg> = cmd.get_positionals().collect();
            positionals.sort_by_key(|p| p.get_index().unwrap_or(usize::MAX));
            let slot = positionals.get(*position).or_else(|| {
                // A repeatable last positional takes every further word.
                positionals
                    .last()
                    .filter(|p| p.get_num_args().is_some_and(|n| n.max_values() > 1))
            });
            if let Some(arg) = slot {
                let (values, d) = values_for(arg, &a, lookup);
                directive = d;
                candidates.extend(values);
            }
        }
    }
    let partial = a.partial.as_str();
    candidates.retain(|c| c.value.starts_with(partial));
    candidates.dedup_by(|x, y| x.value == y.value);
    Completion {
        candidates,
        directive,
    }
}

fn values_for(arg: &Arg, a: &Analysis, lookup: &dyn Lookup) -> (Vec<Candidate>, Directive) {
    let possible = arg.get_possible_values();
    if !possible.is_empty() {
        let values = possible
            .iter()
            .filter(|p| !p.is_hide_set())
            .map(|p| Candidate::new(p.get_name(), p.get_help().map(|h| h.to_string())))
            .collect();
        return (values, Directive::NO_FILE_COMP);
    }
    let plain = |names: Vec<String>| names.into_iter().map(|n| Candidate::new(n, None)).collect();
    match value_kind(arg) {
        ValueKind::HelmOp => (plain(lookup.helmops(a)), Directive::NO_FILE_COMP),
        ValueKind::Namespace => (plain(lookup.namespaces(a)), Directive::NO_FILE_COMP),
        ValueKind::Context => (plain(lookup.contexts(a)), Directive::NO_FILE_COMP),
        ValueKind::Workload => workload_values(a, lookup),
        ValueKind::Path => (Vec::new(), Directive::DEFAULT),
        ValueKind::Other => (Vec::new(), Directive::NO_FILE_COMP),
    }
}

/// `deployment/` and friends until a kind is typed, then that kind's objects.
fn workload_values(a: &Analysis, lookup: &dyn Lookup) -> (Vec<Candidate>, Directive) {
    match a.partial.split_once('/') {
        None => (
            rollout_kinds()
                .map(|k| Candidate::new(format!("{}/", canonical(k)), None))
                .collect(),
            Directive::NO_FILE_COMP.with(Directive::NO_SPACE),
        ),
        Some((kind_text, _)) => {
            let Some(kind) = parse_kind(kind_text) else {
                return (Vec::new(), Directive::NO_FILE_COMP);
            };
            let values = lookup
                .workloads(a, kind)
                .into_iter()
                .map(|name| Candidate::new(format!("{kind_text}/{name}"), None))
                .collect();
            (values, Directive::NO_FILE_COMP)
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::{ArgAction, ValueEnum, ValueHint};

    use super::*;

    #[derive(Clone, Copy, ValueEnum)]
    enum Out {
        /// Human table
        Table,
        Json,
        Yaml,
    }

    /// A stand-in for the real command line with the same shapes: global flags, a subcommand with
    /// a HELMOP positional, one with KIND/NAME, one with a value enum positional, a file flag.
    fn cli() -> Command {
        let mut cmd = Command::new("kubectl-helmop")
            .arg(
                Arg::new("kubeconfig")
                    .long("kubeconfig")
                    .global(true)
                    .value_hint(ValueHint::FilePath),
            )
            .arg(
                Arg::new("context")
                    .long("context")
                    .global(true)
                    .value_name("CONTEXT"),
            )
            .arg(
                Arg::new("namespace")
                    .short('n')
                    .long("namespace")
                    .global(true)
                    .value_name("NAMESPACE"),
            )
            .arg(
                Arg::new("all_namespaces")
                    .short('A')
                    .long("all-namespaces")
                    .global(true)
                    .action(ArgAction::SetTrue),
            )
            .subcommand(
                Command::new("status")
                    .about("Show where things stand\nmore text")
                    .arg(Arg::new("helmop").value_name("HELMOP"))
                    .arg(
                        Arg::new("output")
                            .short('o')
                            .long("output")
                            .value_parser(clap::builder::EnumValueParser::<Out>::new()),
                    ),
            )
            .subcommand(Command::new("rollout").arg(Arg::new("target").value_name("KIND/NAME")))
            .subcommand(
                Command::new("completion")
                    .arg(Arg::new("shell").value_parser(["bash", "zsh", "fish"])),
            )
            .subcommand(
                Command::new("validate").arg(
                    Arg::new("files")
                        .short('f')
                        .long("filename")
                        .value_name("FILE|DIR|-")
                        .action(ArgAction::Append),
                ),
            )
            .subcommand(Command::new("secret").hide(true));
        cmd.build();
        cmd
    }

    struct Fake;
    impl Lookup for Fake {
        fn contexts(&self, _: &Analysis) -> Vec<String> {
            vec!["upstream".into(), "down1".into()]
        }
        fn namespaces(&self, _: &Analysis) -> Vec<String> {
            vec!["default".into(), "fleet-default".into()]
        }
        fn helmops(&self, a: &Analysis) -> Vec<String> {
            // Proves the lookup sees the namespace typed earlier on the line.
            match a.value("namespace") {
                Some("prod") => vec!["web-prod".into()],
                _ => vec!["web".into(), "db".into()],
            }
        }
        fn workloads(&self, _: &Analysis, kind: WorkloadKind) -> Vec<String> {
            match kind {
                WorkloadKind::Deployment => vec!["web".into(), "api".into()],
                _ => Vec::new(),
            }
        }
    }

    fn run(words: &[&str]) -> Completion {
        let words: Vec<String> = words.iter().map(|w| (*w).to_owned()).collect();
        complete(&cli(), &words, &Fake)
    }

    fn values(c: &Completion) -> Vec<&str> {
        c.candidates.iter().map(|c| c.value.as_str()).collect()
    }

    #[test]
    fn subcommands_at_the_top_without_hidden_ones() {
        let c = run(&[""]);
        assert_eq!(values(&c), ["status", "rollout", "completion", "validate"]);
        assert_eq!(c.directive, Directive::NO_FILE_COMP);
        assert_eq!(values(&run(&["st"])), ["status"]);
    }

    #[test]
    fn helmop_names_use_the_namespace_given_before() {
        assert_eq!(values(&run(&["status", ""])), ["web", "db"]);
        assert_eq!(values(&run(&["-n", "prod", "status", "w"])), ["web-prod"]);
        assert_eq!(
            values(&run(&["status", "--namespace=prod", ""])),
            ["web-prod"]
        );
        assert_eq!(values(&run(&["status", "-nprod", ""])), ["web-prod"]);
        // A second positional has nothing to complete.
        assert!(values(&run(&["status", "web", ""])).is_empty());
    }

    #[test]
    fn flags_include_globals_and_carry_help() {
        let c = run(&["status", "--"]);
        let v = values(&c);
        for flag in [
            "--kubeconfig",
            "--context",
            "--namespace",
            "--all-namespaces",
            "--output",
            "--help",
        ] {
            assert!(v.contains(&flag), "{flag} missing in {v:?}");
        }
        assert_eq!(values(&run(&["status", "--out"])), ["--output"]);
    }

    #[test]
    fn flag_values_from_enums_lookups_and_files() {
        let c = run(&["status", "-o", ""]);
        assert_eq!(values(&c), ["table", "json", "yaml"]);
        assert_eq!(c.candidates[0].help.as_deref(), Some("Human table"));
        assert_eq!(values(&run(&["status", "--output=j"])), ["--output=json"]);
        assert_eq!(values(&run(&["--context", ""])), ["upstream", "down1"]);
        assert_eq!(values(&run(&["status", "-n", "f"])), ["fleet-default"]);
        let files = run(&["--kubeconfig", ""]);
        assert!(files.candidates.is_empty());
        assert_eq!(
            files.directive,
            Directive::DEFAULT,
            "the shell completes file names"
        );
        assert_eq!(run(&["validate", "-f", ""]).directive, Directive::DEFAULT);
        assert_eq!(values(&run(&["completion", ""])), ["bash", "zsh", "fish"]);
    }

    #[test]
    fn workloads_kind_first_then_names() {
        let c = run(&["rollout", ""]);
        assert!(values(&c).contains(&"deployment/"));
        assert!(!values(&c).iter().any(|v| v.starts_with("pod")));
        assert_eq!(
            c.directive,
            Directive::NO_FILE_COMP.with(Directive::NO_SPACE)
        );
        assert_eq!(
            values(&run(&["rollout", "deploy/"])),
            ["deploy/web", "deploy/api"]
        );
        assert_eq!(
            values(&run(&["rollout", "deployment/a"])),
            ["deployment/api"]
        );
        assert!(values(&run(&["rollout", "bogus/"])).is_empty());
    }

    #[test]
    fn switches_and_values_are_recorded() {
        let words: Vec<String> = ["-A", "--context", "down1", "status", ""]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        let a = analyse(&cli(), &words);
        assert_eq!(a.path, ["status"]);
        assert_eq!(a.switches, ["all_namespaces"]);
        assert_eq!(a.value("context"), Some("down1"));
        assert_eq!(a.slot, Slot::Word { position: 0 });
    }

    #[test]
    fn render_is_cobra_format() {
        let c = run(&["st"]);
        assert_eq!(c.render(), "status\tShow where things stand\n:4\n");
        let empty = Completion {
            candidates: Vec::new(),
            directive: Directive(1),
        };
        assert_eq!(empty.render(), ":1\n");
    }

    #[test]
    fn never_panics_on_odd_words() {
        for words in [
            vec![],
            vec!["-"],
            vec!["--"],
            vec!["--", ""],
            vec!["-é", ""],
            vec!["--=", ""],
            vec!["status", "--output="],
            vec!["-n"],
            vec!["rollout", "/"],
            vec!["rollout", "é/x"],
        ] {
            let _ = run(&words);
        }
    }
}
