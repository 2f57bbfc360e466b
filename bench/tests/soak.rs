//! The short soak (CI): the real serving stack under sustained keep-alive load with connection churn, the
//! certificate rotated by symlink swap three times in the middle. Zero failed requests, every rotation picked
//! up, memory flat. The long run is `helmop-bench soak --seconds 600` and, against the real webhook process
//! and a cluster, `helmop-bench memory --soak-seconds 600` (docs/performance.md).

use std::time::Duration;

use helmop_bench::soak::{SoakSettings, check, problems};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sustained_load_across_certificate_rotations_has_no_errors_and_flat_memory() {
    let settings = SoakSettings {
        duration: Duration::from_secs(20),
        connections: 8,
        rotate_every: Duration::from_secs(5),
        requests_per_connection: 200,
        sample_every: Duration::from_millis(500),
    };
    let report = check(&settings).await.expect("soak ran");
    eprintln!("{}", report.summary());
    assert!(report.rotations >= 3, "{}", report.summary());
    assert!(
        report.outcome.handshakes > report.rotations as u64 * settings.connections as u64,
        "connections were not renewed across rotations: {}",
        report.summary()
    );
    let problems = problems(&report, 16 * 1024);
    assert!(problems.is_empty(), "{problems:?}\n{}", report.summary());
}
