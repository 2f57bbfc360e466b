//! `kubectl helmop completion bash|zsh|fish` (static scripts for the `kubectl-helmop` command) and
//! the hidden `__complete` entry point behind `kubectl_complete-helmop` (dynamic, for
//! `kubectl helmop ...` with kubectl >= 1.26).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use helmop_core::workload::WorkloadKind;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, ListParams};

use crate::args::KubeArgs;
use crate::cli::complete::{self, Analysis, Lookup};
use crate::cluster::context::Ctx;
use crate::error::{ExitStatus, PluginError};
use crate::output;

#[derive(Debug, Args)]
pub struct CompletionArgs {
    /// The shell to print a completion script for
    #[arg(value_enum)]
    pub shell: CompletionShell,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CompletionShell {
    Bash,
    Zsh,
    Fish,
}

/// Help text of the `completion` command.
pub const ABOUT: &str = "Print a shell completion script for the kubectl-helmop command.\n\n\
With kubectl >= 1.26, `kubectl helmop <TAB>` completes through the kubectl_complete-helmop \
executable (installed next to kubectl-helmop; it must be on PATH as well) - no script needed. \
These scripts complete the plugin when it is run directly as kubectl-helmop.";

pub const EXAMPLES: &str = "Examples:\n  \
source <(kubectl-helmop completion bash)\n  \
kubectl-helmop completion zsh > \"${fpath[1]}/_kubectl-helmop\"\n  \
kubectl-helmop completion fish > ~/.config/fish/completions/kubectl-helmop.fish";

/// `root` is the whole command line's definition (`Cli::command()`), handed in so this module
/// does not depend on the one that lists it.
pub fn run(args: &CompletionArgs, root: clap::Command) -> Result<ExitStatus, PluginError> {
    output::emit(&script(args.shell, root))?;
    Ok(ExitStatus::Ok)
}

/// The completion script for `shell`.
pub fn script(shell: CompletionShell, mut root: clap::Command) -> String {
    let generator = match shell {
        CompletionShell::Bash => clap_complete::Shell::Bash,
        CompletionShell::Zsh => clap_complete::Shell::Zsh,
        CompletionShell::Fish => clap_complete::Shell::Fish,
    };
    let mut buf = Vec::new();
    clap_complete::generate(generator, &mut root, "kubectl-helmop", &mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

/// Name of the hidden argument that switches to the completion protocol.
pub const COMPLETE_ARG: &str = "__complete";

/// `kubectl-helmop __complete WORDS...`: prints the candidates in Cobra's format. Never fails:
/// a shell must not see errors.
pub fn run_complete(mut root: clap::Command, mut words: Vec<String>) -> ExitStatus {
    // The last word is the one being completed: it stays last.
    let current = words.pop();
    let mut words = crate::cli::argv::hoist_connection_words(words);
    words.extend(current);
    root.build();
    let lookup = Live::new();
    let text = complete::complete(&root, &words, &lookup).render();
    let _ = output::emit(&text);
    ExitStatus::Ok
}

/// How long one cluster lookup may take: a shell waits for it.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(3);

/// Lookups against the kubeconfig and cluster named on the command line being completed.
struct Live {
    runtime: Option<tokio::runtime::Runtime>,
}

impl Live {
    fn new() -> Live {
        Live {
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok(),
        }
    }

    fn block<T: Default>(&self, f: impl Future<Output = Option<T>>) -> T {
        let Some(rt) = &self.runtime else {
            return T::default();
        };
        rt.block_on(async { tokio::time::timeout(LOOKUP_TIMEOUT, f).await.ok().flatten() })
            .unwrap_or_default()
    }
}

fn kube_args(a: &Analysis) -> KubeArgs {
    KubeArgs {
        kubeconfig: a.value("kubeconfig").map(PathBuf::from),
        context: a.value("context").map(str::to_owned),
        namespace: a.value("namespace").map(str::to_owned),
        request_timeout: LOOKUP_TIMEOUT,
        upstream_id: None,
        kubeconfig_namespaces: Vec::new(),
    }
}

fn names<K>(
    items: impl IntoIterator<Item = K>,
    name: impl Fn(&K) -> Option<String>,
) -> Vec<String> {
    let mut out: Vec<String> = items.into_iter().filter_map(|i| name(&i)).collect();
    out.sort();
    out.dedup();
    out
}

fn dynamic_names(items: Vec<DynamicObject>) -> Option<Vec<String>> {
    Some(names(items, |o| o.metadata.name.clone()))
}

impl Lookup for Live {
    fn contexts(&self, a: &Analysis) -> Vec<String> {
        let mut args = kube_args(a);
        // The context being completed may not exist; the list does not depend on it.
        args.context = None;
        self.block(async {
            let ctx = Ctx::connect(&args).await.ok()?;
            Some(names(ctx.kubeconfig?.contexts, |c| Some(c.name.clone())))
        })
    }

    fn namespaces(&self, a: &Analysis) -> Vec<String> {
        let mut args = kube_args(a);
        args.namespace = None;
        self.block(async {
            let ctx = Ctx::connect(&args).await.ok()?;
            let list = Api::<Namespace>::all(ctx.upstream)
                .list(&ListParams::default())
                .await
                .ok()?;
            Some(names(list.items, |n| n.metadata.name.clone()))
        })
    }

    fn helmops(&self, a: &Analysis) -> Vec<String> {
        let args = kube_args(a);
        let all = a.switches.iter().any(|s| s == "all_namespaces");
        self.block(async {
            let ctx = Ctx::connect(&args).await.ok()?;
            let resource = ApiResource {
                group: "fleet.cattle.io".into(),
                version: "v1alpha1".into(),
                api_version: "fleet.cattle.io/v1alpha1".into(),
                kind: "HelmOp".into(),
                plural: "helmops".into(),
            };
            let api: Api<DynamicObject> = if all {
                Api::all_with(ctx.upstream, &resource)
            } else {
                Api::namespaced_with(ctx.upstream, &ctx.namespace, &resource)
            };
            dynamic_names(api.list(&ListParams::default()).await.ok()?.items)
        })
    }

    fn workloads(&self, a: &Analysis, kind: WorkloadKind) -> Vec<String> {
        let args = kube_args(a);
        self.block(async {
            let ctx = Ctx::connect(&args).await.ok()?;
            let (group, version, kind_name) = kind.gvk();
            let resource = ApiResource {
                group: group.into(),
                version: version.into(),
                api_version: kind.api_version(),
                kind: kind_name.into(),
                plural: kind.plural().into(),
            };
            let api: Api<DynamicObject> =
                Api::namespaced_with(ctx.upstream, &ctx.namespace, &resource);
            dynamic_names(api.list(&ListParams::default()).await.ok()?.items)
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;
    use crate::cli::Cli;

    #[test]
    fn scripts_name_the_binary_and_its_commands() {
        for shell in [
            CompletionShell::Bash,
            CompletionShell::Zsh,
            CompletionShell::Fish,
        ] {
            let s = script(shell, Cli::command());
            assert!(s.contains("kubectl-helmop"), "{shell:?}");
            assert!(s.contains("validate"), "{shell:?}");
            assert!(s.contains("completion"), "{shell:?}");
            assert!(s.contains("rollout"), "{shell:?}");
            assert!(s.contains("lease-duration"), "{shell:?}");
        }
        assert!(
            script(CompletionShell::Zsh, Cli::command()).starts_with("#compdef kubectl-helmop")
        );
    }
}
