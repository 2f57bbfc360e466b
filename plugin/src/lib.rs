//! The library of `kubectl-helmop` (the kubectl plugin, `kubectl helmop ...`): the command line,
//! the cluster-facing runs and the watchers behind it. `src/main.rs` only wires the command line to
//! the commands; `propagate --watch` and the tests call the entry points listed in
//! plugin/README.md ("Library entry points").
//!
//! - [`cli`]: the command line (clap) and one module per subcommand ([`cli::cmd`]).
//! - [`cluster`]: reaching clusters: the shared [`cluster::context::Ctx`], downstream clusters and
//!   their clients, the upstream id, reading API errors.
//! - [`run`]: a run over the downstream clusters: what it covers and how it walks them, what is
//!   upstream and downstream, planning, and the three runs ([`run::propagate`], [`run::status`],
//!   [`run::prune`]); the workloads reading helmop's copies.
//! - [`watch`]: `propagate --watch`, with its leader election ([`watch::leader`], also taken by
//!   `rollout --watch`); [`rollout_watch`]: `rollout --watch`; [`images`]: `images [--watch]`;
//!   [`check`]: the install doctor.
//! - [`output`]: writing results, and the rows and reports of the cluster-facing commands.
//! - Below them all: [`error`] (the error type and exit codes), [`args`] (the option groups the
//!   commands flatten and the entry points take), [`identity`] and [`humanize`] (which the error
//!   messages use), [`test_pause`].

pub mod args;
pub mod check;
pub mod cli;
pub mod cluster;
pub mod error;
pub mod humanize;
pub mod identity;
pub mod images;
pub mod output;
pub mod rollout_watch;
pub mod run;
pub mod test_pause;
pub mod watch;
