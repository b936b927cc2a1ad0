//! CPU time and peak memory of processes, from /proc: what the benchmarks report per service.

/// User + system CPU seconds of `pid` so far (USER_HZ = 100 on Linux).
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    stat_times(pid).map(|[utime, stime, ..]| (utime + stime) / 100.0)
}

/// Like [`cpu_seconds`], with the CPU of the children `pid` has reaped: a server's exited
/// workers (Postgres's backends) stay counted in it.
pub fn cpu_seconds_with_reaped(pid: u32) -> Option<f64> {
    stat_times(pid).map(|t| t.iter().sum::<f64>() / 100.0)
}

/// utime, stime, cutime and cstime of `pid`, in clock ticks.
fn stat_times(pid: u32) -> Option<[f64; 4]> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may contain spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| fields.get(i)?.parse::<f64>().ok();
    Some([tick(11)?, tick(12)?, tick(13)?, tick(14)?])
}

/// Peak resident memory of `pid` (VmHWM), MiB.
pub fn peak_rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
}

/// Every process whose command name is `comm` (e.g. `postgres`: the server and its backends).
pub fn pids_named(comm: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim_end() == comm)
        })
        .collect()
}

/// Total CPU seconds of every live process named `comm`, with the children they reaped: a
/// Postgres backend that exits between two readings moves its CPU into the server's count
/// instead of taking it out of the total (which once made a phase's Postgres CPU negative).
pub fn cpu_seconds_named(comm: &str) -> f64 {
    pids_named(comm)
        .into_iter()
        .filter_map(cpu_seconds_with_reaped)
        .sum()
}

/// CPU seconds used so far by this process, by Postgres (server and backends) and by
/// nats-server: the benchmarks' split of where a phase's work went.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuSplit {
    pub this: f64,
    pub postgres: f64,
    pub nats: f64,
}

impl CpuSplit {
    pub fn now() -> Self {
        Self {
            this: cpu_seconds(std::process::id()).unwrap_or(0.0),
            postgres: cpu_seconds_named("postgres"),
            nats: cpu_seconds_named("nats-server"),
        }
    }

    /// What was used between `earlier` and now.
    pub fn since(earlier: Self) -> Self {
        Self::between(earlier, Self::now())
    }

    /// What was used between two readings.
    pub fn between(earlier: Self, later: Self) -> Self {
        Self {
            this: later.this - earlier.this,
            postgres: later.postgres - earlier.postgres,
            nats: later.nats - earlier.nats,
        }
    }

    pub fn total(&self) -> f64 {
        self.this + self.postgres + self.nats
    }

    /// Microseconds of CPU per unit of work, for `units` units.
    pub fn per_unit_us(&self, units: usize) -> Self {
        let per = |s: f64| s * 1e6 / units.max(1) as f64;
        Self {
            this: per(self.this),
            postgres: per(self.postgres),
            nats: per(self.nats),
        }
    }
}

/// CPU seconds the whole machine has been busy so far (user, nice, system, irq, softirq, steal;
/// from /proc/stat), to show how busy the cores were whoever used them.
pub fn machine_busy_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return 0.0;
    };
    let f: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal
    [0, 1, 2, 5, 6, 7]
        .iter()
        .filter_map(|i| f.get(*i))
        .sum::<f64>()
        / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reaped_childs_cpu_counts_with_its_parent_and_not_in_its_own_time() {
        let me = std::process::id();
        let reaped = || cpu_seconds_with_reaped(me).unwrap() - cpu_seconds(me).unwrap();
        let before = reaped();
        let burn = "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done";
        let status = std::process::Command::new("sh")
            .args(["-c", burn])
            .status()
            .unwrap();
        assert!(status.success());
        let after = reaped();
        assert!(after - before >= 0.05, "reaped CPU {before} s -> {after} s");
    }
}
