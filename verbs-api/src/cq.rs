//! Completion queues (ibv_cq) and waiting on them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferroce_stack::transport::{CqHandle, WorkCompletion};

use crate::context::{Context, Shared};
use crate::engine::EngineMode;
use crate::error::{Error, Result};

/// How long `wait` polls the device itself before sleeping.
const SPIN: Duration = Duration::from_micros(30);
/// A CQ counts as polled by the application if one of its last this many
/// polls (of any CQ of the device) was of it (see [`CompletionQueue::wait_progress`]).
pub const POLLED_WINDOW: u64 = 64;

/// A completion queue of fixed depth; overflow is an async error event, as in ibverbs.
#[derive(Debug)]
pub struct CompletionQueue {
    pub(crate) shared: Arc<Shared>,
    pub(crate) handle: CqHandle,
    depth: u32,
}

impl Context {
    /// A completion queue with room for `depth` completions.
    pub fn create_cq(&self, depth: u32) -> Result<CompletionQueue> {
        let handle = self.shared.engine.lock().core.create_cq(depth)?;
        Ok(CompletionQueue {
            shared: Arc::clone(&self.shared),
            handle,
            depth,
        })
    }
}

impl CompletionQueue {
    /// The core's handle (what asynchronous events name).
    pub fn handle(&self) -> CqHandle {
        self.handle
    }

    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// Append up to `max` completions to `out`, oldest first; returns how
    /// many. In polling mode this also runs one engine step first.
    pub fn poll(&self, max: usize, out: &mut Vec<WorkCompletion>) -> Result<usize> {
        self.poll_each(max, |_, wc| out.push(*wc))
    }

    /// Hand up to `max` completions, oldest first, to `f` under one lock
    /// (no intermediate buffer); returns how many. In polling mode this also
    /// runs one engine step first.
    pub fn poll_each(
        &self,
        max: usize,
        mut f: impl FnMut(usize, &WorkCompletion),
    ) -> Result<usize> {
        let engine = &self.shared.engine;
        if engine.mode == EngineMode::Polling {
            engine.step_now();
        }
        self.shared.check_engine()?;
        let mut inner = engine.lock();
        inner.core.note_cq_poll(self.handle);
        let mut n = 0;
        while n < max {
            match inner.core.poll_cq_one(self.handle) {
                Some(wc) => f(n, &wc),
                None => break,
            }
            n += 1;
        }
        Ok(n)
    }

    /// Run one engine step from this thread if the device is free right now
    /// (a busy-polling application then takes its own frames instead of
    /// waiting for a hand-off from the engine thread). True if frames moved.
    pub fn try_progress(&self) -> bool {
        self.shared.engine.try_step().is_some_and(|n| n > 0)
    }

    /// Completions waiting.
    pub fn len(&self) -> usize {
        self.shared.engine.lock().core.cq_len(self.handle)
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Completions ever queued here (a completion channel's arming fires on
    /// the first one after it).
    pub fn added(&self) -> u64 {
        self.shared.engine.lock().core.cq_added(self.handle)
    }

    /// Block until at least one completion is waiting or `timeout` passes
    /// (the completion-channel wait of ibverbs, without the fd).
    pub fn wait(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let engine = &self.shared.engine;
        loop {
            self.shared.check_engine()?;
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Timeout(timeout, "a completion"));
            }
            match engine.mode {
                EngineMode::Polling => {
                    if engine.step_now() == 0 {
                        if !self.is_empty() {
                            return Ok(());
                        }
                        let idle = engine.lock().idle_timeout();
                        engine.wait_io(idle.min(deadline - now).min(Duration::from_micros(200)));
                    } else if !self.is_empty() {
                        return Ok(());
                    }
                }
                EngineMode::Thread => {
                    // Poll the device from this thread for a short while
                    // first: an answer that is already on its way arrives
                    // without two thread hand-offs (engine wake-up, then
                    // this thread's). Then sleep on the engine's progress.
                    let spin_until = Instant::now() + SPIN;
                    while Instant::now() < spin_until {
                        if engine.try_step().is_some() && !self.is_empty() {
                            return Ok(());
                        }
                        std::hint::spin_loop();
                    }
                    let inner = engine.lock();
                    if inner.core.cq_len(self.handle) > 0 {
                        return Ok(());
                    }
                    let _unused = engine
                        .progress
                        .wait_timeout(inner, (deadline - now).min(Duration::from_millis(50)))
                        .unwrap_or_else(|p| p.into_inner());
                }
            }
        }
    }

    /// Block until a completion is waiting (in a CQ of the device that the
    /// application polls: one of its last [`POLLED_WINDOW`] polls), the
    /// device moved any frames, or `timeout` passes: for a caller that also
    /// polls memory or other CQs. A WRITE that lands in a region completes
    /// nothing at its target, yet an application spinning on the region's
    /// bytes between CQ polls (UCX's put latency test, perftest's WRITE
    /// latency) waits for exactly that; and one polling several CQs in turn
    /// (UCX) must not sleep on an empty one while another holds a completion.
    /// [`wait`] would keep either asleep until the time-out.
    ///
    /// [`wait`]: CompletionQueue::wait
    pub fn wait_progress(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let engine = &self.shared.engine;
        self.shared.check_engine()?;
        let seen = {
            let inner = engine.lock();
            if inner.core.completions_waiting_in_polled(POLLED_WINDOW) {
                return Ok(());
            }
            engine.moved_steps()
        };
        match engine.mode {
            EngineMode::Polling => {
                if engine.step_now() == 0 {
                    // Under one lock: whether to wait at all, and how long.
                    let idle = {
                        let mut inner = engine.lock();
                        (!inner.core.completions_waiting_in_polled(POLLED_WINDOW))
                            .then(|| inner.idle_timeout())
                    };
                    if let Some(idle) = idle {
                        engine.wait_io(idle.min(timeout).min(Duration::from_micros(200)));
                        engine.step_now();
                    }
                }
            }
            EngineMode::Thread => {
                let spin_until = Instant::now() + SPIN.min(timeout);
                while Instant::now() < spin_until {
                    // Frames moved by this thread's step or the engine thread's.
                    let stepped = engine.try_step();
                    if engine.moved_steps() != seen {
                        return Ok(());
                    }
                    if stepped.is_none() {
                        // The engine thread holds the device: on a shared
                        // core, spinning would keep it from finishing.
                        std::thread::yield_now();
                    } else {
                        std::hint::spin_loop();
                    }
                }
                let inner = engine.lock();
                if engine.moved_steps() != seen
                    || inner.core.completions_waiting_in_polled(POLLED_WINDOW)
                {
                    return Ok(());
                }
                // Steps count under the lock and notify after it: none is missed.
                let left = deadline.saturating_duration_since(Instant::now());
                let _unused = engine
                    .progress
                    .wait_timeout(inner, left)
                    .unwrap_or_else(|p| p.into_inner());
            }
        }
        self.shared.check_engine()
    }

    /// Block until one of `cqs` (all of one device), each given with a count
    /// of [`added`](CompletionQueue::added) completions, has had one added
    /// since, or `timeout` passes: the wait of a completion channel, whose
    /// arming fires on new completions only.
    pub fn wait_any_added(cqs: &[(&CompletionQueue, u64)], timeout: Duration) -> Result<()> {
        let Some((first, _)) = cqs.first() else {
            std::thread::sleep(timeout);
            return Err(Error::Timeout(timeout, "a completion"));
        };
        first.wait_until(timeout, |core| {
            cqs.iter()
                .any(|(c, since)| core.cq_added(c.handle) > *since)
        })
    }

    /// Block until `ready` holds of this CQ's device core (checked under the
    /// lock the engine completes under) or `timeout` passes.
    fn wait_until(
        &self,
        timeout: Duration,
        ready: impl Fn(&ferroce_stack::transport::Core) -> bool,
    ) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let engine = &self.shared.engine;
        loop {
            self.shared.check_engine()?;
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Timeout(timeout, "a completion"));
            }
            let inner = engine.lock();
            if ready(&inner.core) {
                return Ok(());
            }
            let slice = (deadline - now).min(Duration::from_millis(50));
            match engine.mode {
                EngineMode::Thread => {
                    let _unused = engine
                        .progress
                        .wait_timeout(inner, slice)
                        .unwrap_or_else(|p| p.into_inner());
                }
                EngineMode::Polling => {
                    drop(inner);
                    if engine.step_now() == 0 {
                        engine.wait_io(slice.min(Duration::from_micros(200)));
                    }
                }
            }
        }
    }

    /// Wait for and return exactly `n` completions (a helper for tools and tests).
    pub fn poll_n(&self, n: usize, timeout: Duration) -> Result<Vec<WorkCompletion>> {
        let deadline = Instant::now() + timeout;
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let got = self.poll(n - out.len(), &mut out)?;
            if out.len() >= n {
                break;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout(timeout, "completions"));
            }
            if got == 0 {
                self.wait(left)?;
            }
        }
        Ok(out)
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        let _ = self.shared.engine.lock().core.destroy_cq(self.handle);
    }
}
