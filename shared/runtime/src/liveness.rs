//! Liveness that means the work loops make progress, not only that the process answers.
//!
//! Each loop holds a [`Progress`] and calls [`Progress::beat`] when it has done a round of work
//! (or looked and found none), and [`Progress::idle_for`] before a planned sleep. `/livez` fails
//! once any loop has gone [`stall_after`] past its last beat (or past the end of its planned
//! sleep): a loop stuck in a call that never returns is then restarted by Kubernetes instead of
//! holding its work for ever. A loop that ends (shutdown) drops its `Progress` and stops counting.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

static STARTED: LazyLock<Instant> = LazyLock::new(Instant::now);
static STALL_AFTER_MS: AtomicU64 = AtomicU64::new(5 * 60 * 1000);
static LOOPS: LazyLock<Mutex<Vec<Arc<Beat>>>> = LazyLock::new(|| Mutex::new(Vec::new()));

/// How long a loop may go without progress before `/livez` fails (`TIDINGS_STALL_AFTER`).
pub fn set_stall_after(bound: Duration) {
    STALL_AFTER_MS.store(millis(bound), Ordering::Relaxed);
}

pub fn stall_after() -> Duration {
    Duration::from_millis(STALL_AFTER_MS.load(Ordering::Relaxed))
}

fn millis(d: Duration) -> u64 {
    // Milliseconds past `u64` are 584 million years.
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn now_ms() -> u64 {
    millis(STARTED.elapsed())
}

struct Beat {
    name: String,
    /// Milliseconds since process start by which the loop must beat again.
    deadline: AtomicU64,
}

/// One work loop's progress; see the module docs.
pub struct Progress(Arc<Beat>);

impl Progress {
    /// Registers the loop `name` (e.g. `dispatch`), counting from now.
    pub fn register(name: impl Into<String>) -> Progress {
        let beat = Arc::new(Beat {
            name: name.into(),
            deadline: AtomicU64::new(0),
        });
        let progress = Progress(beat.clone());
        progress.beat();
        if let Ok(mut loops) = LOOPS.lock() {
            loops.push(beat);
        }
        progress
    }

    /// The loop did a round of work, or looked and found none.
    pub fn beat(&self) {
        self.idle_for(Duration::ZERO);
    }

    /// The loop is about to sleep for `planned` on purpose: that time does not count.
    pub fn idle_for(&self, planned: Duration) {
        let deadline = now_ms()
            .saturating_add(millis(planned))
            .saturating_add(STALL_AFTER_MS.load(Ordering::Relaxed));
        self.0.deadline.store(deadline, Ordering::Relaxed);
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Ok(mut loops) = LOOPS.lock() {
            loops.retain(|b| !Arc::ptr_eq(b, &self.0));
        }
    }
}

/// The loops past their deadline, each as "`name`: no progress for N s", for `/livez`.
pub fn stalled() -> Vec<String> {
    let now = now_ms();
    let stall = STALL_AFTER_MS.load(Ordering::Relaxed);
    LOOPS
        .lock()
        .map(|loops| {
            loops
                .iter()
                .filter_map(|b| {
                    let deadline = b.deadline.load(Ordering::Relaxed);
                    (now > deadline).then(|| {
                        let quiet = (now - deadline).saturating_add(stall) / 1000;
                        format!("{}: no progress for {quiet} s", b.name)
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test: the bound and the registry are process-wide.
    #[test]
    fn a_loop_that_stops_beating_is_stalled_until_it_beats_again() {
        set_stall_after(Duration::from_millis(150));
        let frozen = Progress::register("frozen");
        let sleeping = Progress::register("sleeping");
        sleeping.idle_for(Duration::from_secs(60));
        assert!(stalled().is_empty());
        std::thread::sleep(Duration::from_millis(300));
        let found = stalled();
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with("frozen: no progress for "),
            "{found:?}"
        );
        frozen.beat();
        assert!(stalled().is_empty());
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(stalled().len(), 1);
        drop(frozen);
        assert!(stalled().is_empty(), "a loop that ended no longer counts");
        drop(sleeping);
        set_stall_after(Duration::from_secs(300));
    }
}
