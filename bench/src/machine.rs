//! What the numbers were measured on.

pub fn describe() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(str::trim)
        .unwrap_or("unknown CPU");
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_gib = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0 / 1024.0);
    format!(
        "{cpus} CPUs ({model}), {mem_gib:.1} GiB RAM, load average at start {}",
        load_average()
    )
}

/// The 1, 5 and 15 minute load averages of `/proc/loadavg`, e.g. `2.13 2.01 1.91`.
pub fn load_average() -> String {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    load.join(" ")
}

/// CPU time (user + system, all threads) this process has used so far, from `/proc/self/stat` (clock ticks of
/// 10 ms; `None` where that file cannot be read).
pub fn process_cpu() -> Option<std::time::Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name, which is in parentheses and may contain spaces.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line, 12 and 13 after the name.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(std::time::Duration::from_millis(ticks * 10))
}

/// Resident set size of a process in KiB (`VmRSS` of `/proc/PID/status`; `self` for this process).
pub fn rss_kib(pid: &str) -> Option<u64> {
    status_kib(pid, "VmRSS:")
}

/// Peak resident set size of a process in KiB (`VmHWM` of `/proc/PID/status`).
pub fn hwm_kib(pid: &str) -> Option<u64> {
    status_kib(pid, "VmHWM:")
}

fn status_kib(pid: &str, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_cpu_is_read_and_grows_with_work() {
        let before = process_cpu().expect("/proc/self/stat is readable on Linux");
        // Busy until the clock tick advances; on a loaded machine that may take a while of wall time.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let mut x = 0u64;
        loop {
            for _ in 0..1_000_000 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
            let now = process_cpu().expect("/proc/self/stat is readable on Linux");
            if now > before {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "process CPU time did not advance from {before:?} in 30 s of busy work"
            );
        }
    }
}
