//! The command line (clap). Help text reads `kubectl helmop ...`, as kubectl runs plugins.
//!
//! [`Cli`] and [`Command`] here; one module per subcommand in [`cmd`]; the connection flags typed
//! before the subcommand ([`argv`]), the `__complete` protocol ([`complete`]) and `-f` inputs
//! ([`inputs`]) beside them.

pub mod argv;
pub mod cmd;
pub mod complete;
pub mod inputs;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "kubectl-helmop",
    bin_name = "kubectl helmop",
    version,
    about = "Validate, propagate and watch the downstream resources of Fleet HelmOps",
    long_about = "kubectl helmop works with Rancher Fleet HelmOps (fleet.cattle.io/v1alpha1) and the Secrets and \
ConfigMaps they list in spec.downstreamResources.\n\n\
Exit codes: 0 all good (warnings allowed), 1 invalid input or denied, 2 partial failure \
(some clusters failed), 3 could not reach the upstream cluster."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Lint HelmOp manifests offline with the admission webhook's rules
    #[command(
        long_about = "Lint HelmOp manifests offline with the admission webhook's rules.\n\n\
Reads every YAML/JSON document of the given files (multi-document files, directories \
recursively, - for stdin), checks each HelmOp (fleet.cattle.io/v1alpha1) and prints every \
finding with its file, line, document and JSON path. Other documents are skipped with a note.\n\n\
With --cluster, every Secret and ConfigMap a HelmOp lists in spec.downstreamResources (root and \
per target) must also exist in the HelmOp's namespace on the cluster (metadata.namespace, else -n, \
else the context's namespace), unless the HelmOp is annotated helmop.dev/allow-missing: \"true\" \
(then a warning): the webhook's rule, checked before you apply. Only metadata is read.\n\n\
Exits 1 if any HelmOp is denied or any input cannot be read or parsed, 3 if --cluster was given \
and the cluster cannot be reached, else 0 (warnings allowed).",
        after_help = "Examples:\n  kubectl helmop validate -f helmop.yaml\n  kubectl helmop validate -f manifests/ -o json\n  cat helmop.yaml | kubectl helmop validate -f -\n  kubectl helmop validate -f helmop.yaml --cluster --context management"
    )]
    Validate(crate::cli::cmd::validate::ValidateArgs),
    /// Copy the downstream resources of HelmOps to the clusters they target
    #[command(
        long_about = "Copy the Secrets and ConfigMaps HelmOps list in spec.downstreamResources to the \
clusters they target (Fleet Clusters and ClusterGroups on the upstream cluster, or --target-context), \
with server-side apply (field manager kubectl-helmop). Unchanged copies are not written at all; \
same-named objects helmop does not own are reported Conflict and left alone unless --adopt; \
opted-in workloads reading a changed copy get a helmop.dev/restamp so they roll.\n\n\
Exits 0 when everything is in place, 1 on a Conflict, a missing source or invalid targets, \
2 when a cluster was unreachable or a write failed, 3 when the upstream cluster cannot be reached.",
        after_help = "Examples:\n  kubectl helmop propagate my-app -n fleet-default\n  kubectl helmop propagate -A --dry-run\n  kubectl helmop propagate my-app --target-context staging --target-context prod"
    )]
    Propagate(crate::cli::cmd::propagate::PropagateArgs),
    /// Show, per HelmOp, cluster and resource, whether the copies are in sync
    #[command(
        long_about = "Show one row per HelmOp x cluster x resource: Synced, Stale, Missing, SourceMissing, \
Conflict, Unreachable, Orphaned, Kept or FleetManaged (with whether Fleet's agent copied the latest: \
current, pending, blocked or unknown), and per opted-in workload reading a copy \
whether its stamp is current (Current) or not (RolloutPending), Paused or Invalid where Fleet \
would not deliver. Compares keyed content hashes: the data of a copy is read only to hash it in \
memory with the upstream's key (a copy edited downstream is Drifted), never printed, logged or \
stored.\n\n\
A workload the rollout watcher holds back (its newest Event of the watcher is RestampHeld, \
RestampBreakerOpen, RestampIneffective, RestampDeferred, RestampUnwatched or RolloutStalled, not \
Restamped) is shown held, e.g. RolloutPending (held: missing), with the Event's note in -o wide and \
a field hold (reason, note) in JSON and YAML. Events are read only in the namespaces of workload \
rows, at most 5000 per namespace; Events that cannot be read are a note, not an error.\n\n\
Exits 0 (out-of-sync rows and held workloads are a state, not an error), 1 when a HelmOp's targets \
are invalid or Fleet rejects it, \
2 when a cluster could not be read, 3 when the upstream cluster cannot be reached.",
        after_help = "Examples:\n  kubectl helmop status my-app -n fleet-default\n  kubectl helmop status -A -o wide\n  kubectl helmop status -A -o json"
    )]
    Status(crate::cli::cmd::status::StatusArgs),
    /// Delete copies no HelmOp wants any more
    #[command(
        long_about = "Delete the copies no HelmOp wants any more (entry removed, namespace changed, \
cluster untargeted, HelmOp deleted). Runs only after HelmOps, Clusters, ClusterGroups and all \
targets were enumerated without error; touches only objects with helmop's markers whose owners \
become empty (other owners are kept, keepResources copies are kept), with uid and \
resourceVersion preconditions on every write.\n\n\
Exits 0, 1 when the enumeration is incomplete (nothing deleted), 2 when a cluster could not be \
read or a delete failed, 3 when the upstream cluster cannot be reached.",
        after_help = "Examples:\n  kubectl helmop prune my-app -n fleet-default --dry-run\n  kubectl helmop prune -A"
    )]
    Prune(crate::cli::cmd::prune::PruneArgs),
    /// Restamp one workload now and report whether its stamp changed
    #[command(
        long_about = "Set a new helmop.dev/restamp annotation on one workload, so the admission webhook \
recomputes the helmop.dev/config-hash stamp in its pod template from what the pods read right now, \
and report whether the stamp changed (then the workload rolls) or not (its pods already run with \
the current configuration). Works on the cluster of the current (or --context) context.\n\n\
With --watch (and no KIND/NAME), keep doing that for every opted-in workload whose stamp no longer \
matches what its pods read, whoever changed it: watches the workloads and the Secrets and ConfigMaps \
they read (metadata only; the data only of what a workload reads, once per version), decides with \
the webhook's own rule, restamps with per-workload coalescing (--debounce), a cap on concurrent \
restamps (--max-concurrent) and back-off on refusals, under leader election on one Lease per scope. \
Prints one event per line (-o json: JSON Lines) until SIGINT/SIGTERM, then exits 0.\n\n\
Exits 0 when the workload was restamped, 1 when it does not exist or the request is refused, \
3 when the cluster cannot be reached.",
        after_help = "Examples:\n  kubectl helmop rollout deployment/web -n apps\n  kubectl helmop rollout sts/db --context down1 -o json\n  kubectl helmop rollout deploy/web --dry-run\n  kubectl helmop rollout -A --watch\n  kubectl helmop rollout -n apps -l tier=web --watch --dry-run"
    )]
    Rollout(crate::cli::cmd::rollout::RolloutArgs),
    /// List the mutable image tags of opted-in workloads and whether the registry moved them
    #[command(
        long_about = "List, per opted-in workload (namespace label helmop.dev/rollout-on-change=enabled or \
workload label \"true\"), every container whose image tag moves (latest, no tag, --mutable-tags): the \
digest it runs (pinned in the image, or helmop.dev/image-digests in annotate mode) and the digest the \
registry has for the tag now: Current, Outdated (a restamp rolls it), Unpinned (nothing recorded a \
digest) or Unresolvable (with the registry's reason). Registry credentials come from the pod's \
imagePullSecrets and its ServiceAccount's, as for the kubelet and the webhook.\n\n\
With --watch, polls every --interval (+-10%) and restamps (helmop.dev/restamp) each Outdated \
workload once its new digest has stayed the same for --debounce (default: one interval), so a burst \
of pushes rolls it once; a restamp the webhook did not turn into a new pin is retried with back-off. \
Runs until SIGINT/SIGTERM, then exits 0.\n\n\
Exits 0 when the registry answered for every row, 1 on invalid input, 2 when some rows are \
Unresolvable, 3 when the cluster cannot be reached.",
        after_help = "Examples:\n  kubectl helmop images -n apps\n  kubectl helmop images -A -o wide --registry-config registries.yaml\n  kubectl helmop images -A --watch --interval 30s"
    )]
    Images(crate::cli::cmd::images::ImagesArgs),
    /// Check an install: webhook configurations, their answers, certificates, hash key, leases
    #[command(
        long_about = "Check helmop's install on the cluster of the current (or --context) context, like a \
doctor: the webhook configurations (validating and mutating; a stamping-only install has no \
validating webhooks, which is reported, not an error), whether they answer through the API server \
(a server-side dry-run create of an invalid HelmOp, which helmop must deny; with -n, also of an \
opted-in Deployment, which must come back stamped; nothing is stored), whether each caBundle \
verifies the serving certificate and how long that is valid, the hash-key Secret (metadata only), \
the opted-in namespaces and workloads, the current user's rights for propagate, prune and \
rollout (SelfSubjectAccessReview), and the Leases of the propagator and the rollout watcher.\n\n\
Every finding is ok, warning or problem; problems and warnings come with a one-line fix.\n\n\
Exits 0 when no problem was found (warnings allowed), 1 when one was, 3 when the cluster \
cannot be reached.",
        after_help = "Examples:\n  kubectl helmop check\n  kubectl helmop check --context down1 -n apps\n  kubectl helmop check -o json"
    )]
    Check(crate::cli::cmd::check::CheckArgs),
    /// Print a shell completion script (bash, zsh, fish)
    #[command(
        long_about = crate::cli::cmd::completion::ABOUT,
        after_help = crate::cli::cmd::completion::EXAMPLES
    )]
    Completion(crate::cli::cmd::completion::CompletionArgs),
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use std::path::PathBuf;

    use super::*;
    use crate::cli::cmd::validate::OutputFormat;

    #[test]
    fn definition_is_consistent() {
        Cli::command().debug_assert();
    }

    /// docs/cli.md is the command line as clap defines it: regenerate it with
    /// `HELMOP_WRITE_CLI_DOC=1 cargo test -p kubectl-helmop cli_reference` after changing a flag.
    #[test]
    fn cli_reference_is_current() {
        let rendered = clap_markdown::help_markdown_custom::<Cli>(
            &clap_markdown::MarkdownOptions::new()
                .title("kubectl helmop: command-line reference".to_owned())
                .show_footer(false)
                // The bin name has a space (`kubectl helmop`), which its anchors would keep.
                .show_table_of_contents(false),
        );
        let doc = format!(
            "<!-- Generated from plugin/src/cli/mod.rs by the test cli_reference_is_current; do not edit. -->\n\n{rendered}"
        );
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/cli.md");
        if std::env::var_os("HELMOP_WRITE_CLI_DOC").is_some() {
            std::fs::write(&path, &doc).unwrap();
        }
        let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            checked_in == doc,
            "docs/cli.md is stale: run HELMOP_WRITE_CLI_DOC=1 cargo test -p kubectl-helmop cli_reference"
        );
    }

    #[test]
    fn help_reads_kubectl_helmop() {
        let help = Cli::command().render_help().to_string();
        assert!(help.contains("Usage: kubectl helmop"), "{help}");
        let mut cmd = Cli::command();
        let validate = cmd.find_subcommand_mut("validate").unwrap();
        let help = validate.render_help().to_string();
        assert!(help.contains("kubectl helmop validate"), "{help}");
    }

    #[test]
    fn parses_repeated_files_and_output() {
        let cli = Cli::try_parse_from([
            "kubectl-helmop",
            "validate",
            "-f",
            "a.yaml",
            "--filename",
            "dir",
            "-f",
            "-",
            "-o",
            "json",
        ])
        .unwrap();
        let Command::Validate(args) = cli.command else {
            panic!("parsed as another command");
        };
        assert_eq!(
            args.files,
            [
                PathBuf::from("a.yaml"),
                PathBuf::from("dir"),
                PathBuf::from("-")
            ]
        );
        assert_eq!(args.output, OutputFormat::Json);
    }

    #[test]
    fn connection_flags_need_cluster() {
        let cli = Cli::try_parse_from([
            "kubectl-helmop",
            "validate",
            "-f",
            "x",
            "--cluster",
            "--context",
            "up",
            "-n",
            "apps",
            "--request-timeout",
            "5s",
        ])
        .unwrap();
        let Command::Validate(args) = cli.command else {
            panic!("parsed as another command");
        };
        assert!(args.cluster);
        assert_eq!(args.context.as_deref(), Some("up"));
        assert_eq!(args.namespace.as_deref(), Some("apps"));
        assert_eq!(args.request_timeout, std::time::Duration::from_secs(5));
        for flag in [
            ["--context", "up"],
            ["-n", "apps"],
            ["--kubeconfig", "k"],
            ["--request-timeout", "5s"],
        ] {
            let mut argv = vec!["kubectl-helmop", "validate", "-f", "x"];
            argv.extend(flag);
            assert!(
                Cli::try_parse_from(argv).is_err(),
                "{flag:?} without --cluster"
            );
        }
    }

    #[test]
    fn files_are_required() {
        assert!(Cli::try_parse_from(["kubectl-helmop", "validate"]).is_err());
        assert!(
            Cli::try_parse_from(["kubectl-helmop", "validate", "-f", "x", "-o", "xml"]).is_err()
        );
    }
}
