//! The engine: joins one transport core and one packet backend.
//!
//! Each step moves a batch of received frames into the core, fires due
//! timers, and lets the core write frames straight into the backend's TX
//! slots (one copy from the memory region into the frame, none after). By
//! default a thread per device runs the steps and sleeps on the backend's fd
//! (and the core's next timeout) when idle; in polling mode the caller's
//! thread runs them from `poll_cq` for the lowest latency.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use ferroce_nic::PacketIo;
use ferroce_stack::transport::{Core, HwCounter, Instant};

/// Frames moved per backend call.
const BATCH: usize = 64;
/// Most frames one step receives or sends before giving others the lock.
const STEP_LIMIT: usize = 1024;
/// Longest idle sleep: bounds how late a timer armed by another thread
/// (while this one sleeps) can fire.
const MAX_IDLE_SLEEP: Duration = Duration::from_millis(20);
/// Polling mode: when the application has not stepped its device for this
/// long (it is computing, outside the library), the keeper thread steps it,
/// so ACKs, READ responses and retransmissions still go out. Peers time out
/// after 4.096 µs × 2^timeout (16.8 ms at the usual 12), so 5 ms keeps a
/// quiet application from failing their QPs, and costs an active one nothing
/// (its waits step at least every 200 µs).
pub const KEEPER_PERIOD: Duration = Duration::from_millis(5);

/// How long the engine thread keeps polling after a bulk step (one that
/// moved at least [`BULK_STEP_FRAMES`] frames) before it sleeps on the
/// backend's fd. A sleeping engine makes every sender wake it (a wake-up and
/// an IPI per socket buffer, paid by the sending core: 5-6 % of a WRITE
/// client's time over veth); polling for 50 us after traffic gave a 64 KiB
/// WRITE stream 4-10 % more (medians of interleaved rounds against TCP).
const BULK_SPIN: Duration = Duration::from_micros(50);

/// How long the engine thread polls after a small step (a ping-pong's frame
/// or two). Sleeping at once put the UDP backend's 8 B SEND round trip
/// between two pinned namespace hosts into a slow mode: each side's vCPU
/// halts between messages and every message then pays a cross-vCPU wake-up
/// (`scripts/bench-verbs.sh` setting, 3 rounds each: typical half round
/// trip 60-87 us sleeping at once, 7-10 us polling 20 us; AF_PACKET 6.0-6.8
/// us both ways). The poll yields, so a thread sharing the core still runs.
const SMALL_SPIN: Duration = Duration::from_micros(20);

/// A step that moved this many frames is bulk traffic: a GRO batch or a
/// window of a large message, never a ping-pong's one or two.
const BULK_STEP_FRAMES: usize = 8;

/// How often the engine looks at its interface's state (the port's, as an
/// rxe port follows its netdev): one ioctl pair per look.
const LINK_POLL: Duration = Duration::from_millis(100);

/// A change of the port's state (IBV_EVENT_PORT_ACTIVE / IBV_EVENT_PORT_ERR,
/// which rxe raises when its netdev comes up or goes down).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortEvent {
    /// The interface is up and running again.
    Active,
    /// The interface went down or lost its carrier.
    Error,
}

/// `FERROCE_ENGINE_SPIN_US` makes the engine poll that long after *any*
/// step that moved a frame (0 turns the bulk polling off too).
fn spin_override() -> Option<Duration> {
    std::env::var("FERROCE_ENGINE_SPIN_US")
        .ok()
        .and_then(|v| v.parse().ok())
        .map(Duration::from_micros)
}

/// How long the engine thread polls after a step that moved `moved` frames.
fn poll_after_step(moved: usize, over: Option<Duration>) -> Duration {
    match over {
        Some(d) => d,
        None if moved >= BULK_STEP_FRAMES => BULK_SPIN,
        None if moved > 0 => SMALL_SPIN,
        None => Duration::ZERO,
    }
}

/// Who drives the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineMode {
    /// A thread per device; it sleeps when there is nothing to do.
    Thread,
    /// The caller's thread, from `poll_cq` / `wait`; spins, lowest latency.
    /// A keeper thread steps the device only when the caller has not for
    /// [`KEEPER_PERIOD`] (it is busy elsewhere), so peers still get their
    /// ACKs and responses, as from an RNIC.
    Polling,
}

/// The state behind the device lock.
pub(crate) struct Inner {
    pub core: Core,
    pub io: Box<dyn PacketIo>,
    epoch: std::time::Instant,
    /// The clock as the last step read it: what followed the step (its
    /// idle time-out, the engine's spin and keeper bookkeeping) uses this
    /// instead of reading the clock again. A vDSO clock read was 3-5 % of
    /// a UDP receiver's and of an 8-byte allreduce's CPU when each of
    /// those read it for itself.
    last_wall: std::time::Instant,
    /// Writes the counters for `ferroce devices --stats` about once a second.
    pub publisher: Option<crate::counters::Publisher>,
    /// Polling mode: a step whose frames completed receives leaves its
    /// transmissions (the ACKs for them) to the next step, see [`Inner::step`].
    pub defer_tx_after_recv: bool,
    /// A step left its transmissions to this one.
    tx_owed: bool,
    /// The port's interface (None: the mem backend), looked at every [`LINK_POLL`].
    link: Option<ferroce_nic::ifaces::LinkWatch>,
    link_due: std::time::Instant,
    /// The interface's state as last seen: the port's.
    pub port: ferroce_nic::ifaces::LinkState,
    /// Port events not yet taken.
    port_events: std::collections::VecDeque<PortEvent>,
    /// The event hooks were called for the events now waiting; cleared when
    /// the last is taken, so the next one calls them again.
    events_signalled: bool,
    /// A step found events the hooks have not been told of.
    signal_events: bool,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("io", &self.io.kind())
            .finish()
    }
}

impl Inner {
    pub fn new(core: Core, io: Box<dyn PacketIo>) -> Inner {
        let epoch = std::time::Instant::now();
        Inner {
            core,
            io,
            epoch,
            last_wall: epoch,
            publisher: None,
            defer_tx_after_recv: false,
            tx_owed: false,
            link: None,
            link_due: epoch,
            port: ferroce_nic::ifaces::LinkState {
                up: true,
                running: true,
            },
            port_events: Default::default(),
            events_signalled: false,
            signal_events: false,
        }
    }

    /// Makes the port follow `link`'s state, starting with its state now.
    pub fn watch_link(&mut self, link: ferroce_nic::ifaces::LinkWatch) {
        // Messages already queued are older than the state now: not events.
        if let Some(&state) = link.states().last() {
            self.port = state;
        }
        self.link = Some(link);
    }

    /// Looks at the interface: each time the port became active or stopped
    /// being so since the last look queues its event, as rxe's netdev
    /// notifier does (a link down and up again within one look gives both).
    /// A gone interface changes nothing here (the backend fails the device).
    fn poll_link(&mut self) {
        let Some(link) = self.link.as_ref() else {
            return;
        };
        for state in link.states() {
            if state.active() != self.port.active() {
                self.port_events.push_back(if state.active() {
                    PortEvent::Active
                } else {
                    PortEvent::Error
                });
            }
            self.port = state;
        }
    }

    /// The next core event (CQ error, SRQ limit, ...), if any.
    pub fn poll_async_event(&mut self) -> Option<ferroce_stack::transport::AsyncEvent> {
        let ev = self.core.poll_event();
        self.events_taken();
        ev
    }

    /// The next port event, if any.
    pub fn poll_port_event(&mut self) -> Option<PortEvent> {
        let ev = self.port_events.pop_front();
        self.events_taken();
        ev
    }

    /// Whether core or port events wait.
    pub fn events_waiting(&self) -> bool {
        self.core.has_events() || !self.port_events.is_empty()
    }

    fn events_taken(&mut self) {
        if !self.events_waiting() {
            self.events_signalled = false;
        }
    }

    /// The core's clock: nanoseconds since the device opened.
    pub fn now(&self) -> Instant {
        self.core_time(std::time::Instant::now())
    }

    fn core_time(&self, wall: std::time::Instant) -> Instant {
        Instant::from_nanos(wall.saturating_duration_since(self.epoch).as_nanos() as u64)
    }

    /// When the last step ran.
    pub fn last_step(&self) -> std::time::Instant {
        self.last_wall
    }

    /// Let the core fill TX slots until it has nothing more (or the ring is full).
    pub fn flush_tx(&mut self, now: Instant) -> Result<usize, ferroce_nic::NicError> {
        self.tx_owed = false;
        in_batches(|| self.transmit_batch(now))
    }

    /// Up to one batch of frames from the core to the driver (the core's
    /// order: each QP's responses before its requests); a deferred transmit
    /// stays owed.
    fn transmit_batch(&mut self, now: Instant) -> Result<usize, ferroce_nic::NicError> {
        let io = &mut self.io;
        let core = &mut self.core;
        if io.gathers() {
            let mut src = CoreSource { core, now };
            return io.transmit_gather(BATCH, &mut src);
        }
        io.transmit(BATCH, &mut |buf: &mut [u8]| core.poll_transmit(now, buf))
    }

    /// One step: receive, fire timers, transmit. Returns frames moved.
    ///
    /// With `defer_tx_after_recv` (polling mode), a step whose received
    /// frames completed receive work requests returns before it transmits,
    /// once: the application, stepping from its own thread, sees the
    /// completion first and usually posts its answer, and the ACKs then go
    /// in the same batch as that answer (at its `post_send`, or at the next
    /// step) instead of one send call earlier on the ping-pong's critical path.
    pub fn step(&mut self) -> Result<usize, ferroce_nic::NicError> {
        let wall = std::time::Instant::now();
        self.last_wall = wall;
        let mut now = self.core_time(wall);
        let mut moved = 0;
        let mut sent = 0;
        let recvs_before = self.core.stats().hw(HwCounter::RdmaRecvs);
        while moved < STEP_LIMIT {
            let core = &mut self.core;
            let n = self.io.recv_checked(BATCH, &mut |f: &[u8], verified| {
                core.handle_frame_checked(now, f, verified)
            })?;
            moved += n;
            if n < BATCH {
                break;
            }
            // A backlog: answer what came so far (ACKs, READ responses) before reading on.
            // Holding the ACKs for the whole step let a slow receiver (1024 frames took
            // ~80 ms under TCG) outlast the sender's ACK time-out (67 ms at perftest's
            // -u 14): spurious go-back-N resends, 2 in 3000 64 KiB WRITEs.
            self.last_wall = std::time::Instant::now();
            now = self.core_time(self.last_wall);
            sent += self.transmit_batch(now)?;
        }
        if let Some(t) = self.core.poll_timeout() {
            if t <= now {
                self.core.handle_timeout(now);
            }
        }
        let defer = self.defer_tx_after_recv
            && !self.tx_owed
            && self.core.stats().hw(HwCounter::RdmaRecvs) != recvs_before;
        if defer {
            self.tx_owed = true;
        } else {
            sent += self.flush_tx(now)?;
        }
        if self.publisher.as_ref().is_some_and(|p| p.due(wall)) {
            let counters = self.counters();
            if let Some(p) = self.publisher.as_mut() {
                p.write(&counters, false);
            }
        }
        if self.link.is_some() && wall >= self.link_due {
            self.link_due = wall + LINK_POLL;
            self.poll_link();
        }
        if !self.events_signalled && self.events_waiting() {
            self.events_signalled = true;
            self.signal_events = true;
        }
        Ok(moved + sent)
    }

    /// The core's counters, then the packet engine's (`nic_*`): a frame the
    /// core sent but the backend dropped shows up only in the latter.
    fn counters(&self) -> Vec<(&'static str, u64)> {
        let mut v = self.core.stats().named();
        let io = self.io.stats();
        v.extend([
            ("nic_rx_frames", io.rx_frames),
            ("nic_rx_dropped", io.rx_dropped),
            ("nic_tx_frames", io.tx_frames),
            ("nic_tx_dropped", io.tx_dropped),
            ("nic_tx_ring_full", io.tx_ring_full),
            ("nic_tx_gso", io.tx_gso),
            ("nic_syscalls", io.syscalls),
        ]);
        v
    }

    /// The last snapshot, when the device closes.
    pub fn publish_closed(&mut self) {
        if let Some(mut p) = self.publisher.take() {
            p.write(&self.counters(), true);
        }
    }

    /// How long the engine may sleep after the last step before the core
    /// needs it again.
    pub fn idle_timeout(&mut self) -> Duration {
        let now = self.core_time(self.last_wall);
        match self.core.poll_timeout() {
            Some(t) => t.saturating_duration_since(now).min(MAX_IDLE_SLEEP),
            None => MAX_IDLE_SLEEP,
        }
    }
}

/// Calls `send` (which moves up to [`BATCH`] frames) until it moves fewer
/// or [`STEP_LIMIT`] frames have gone; returns how many went.
fn in_batches(
    mut send: impl FnMut() -> Result<usize, ferroce_nic::NicError>,
) -> Result<usize, ferroce_nic::NicError> {
    let mut sent = 0;
    while sent < STEP_LIMIT {
        let n = send()?;
        sent += n;
        if n < BATCH {
            break;
        }
    }
    Ok(sent)
}

/// The core as a gathering backend's frame source: request payloads stay in
/// their memory regions and the kernel copies them from there.
struct CoreSource<'a> {
    core: &'a mut Core,
    now: Instant,
}

impl ferroce_nic::TxSource for CoreSource<'_> {
    fn fill(&mut self, buf: &mut [u8]) -> Option<ferroce_nic::GatherFrame> {
        let s = self.core.poll_transmit_split(self.now, buf)?;
        Some(ferroce_nic::GatherFrame {
            head: s.head,
            tail: s.tail,
            payload: s.payload.map(|p| ferroce_nic::PayloadRef {
                key: p.lkey,
                offset: p.offset,
                len: p.len,
            }),
        })
    }

    fn payload(&self, p: &ferroce_nic::PayloadRef) -> Option<&[u8]> {
        self.core.tx_payload(&ferroce_stack::transport::TxPayload {
            lkey: p.key,
            offset: p.offset,
            len: p.len,
        })
    }
}

/// Callbacks (for the engine's failure, or its events), by number.
#[derive(Default)]
struct Hooks {
    next: u64,
    hooks: Vec<(u64, Box<dyn Fn() + Send + Sync>)>,
}

impl Hooks {
    /// Keeps `hook`; returns its number for [`Hooks::remove`].
    fn add(&mut self, hook: Box<dyn Fn() + Send + Sync>) -> u64 {
        self.next += 1;
        self.hooks.push((self.next, hook));
        self.next
    }

    fn remove(&mut self, id: u64) {
        self.hooks.retain(|(i, _)| *i != id);
    }

    fn call_all(&self) {
        for (_, hook) in &self.hooks {
            hook();
        }
    }
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks")
            .field("hooks", &self.hooks.len())
            .finish()
    }
}

/// What the device's handles share: the lock, a condition variable for
/// completion waiters, and the engine thread's state.
#[derive(Debug)]
pub(crate) struct Engine {
    pub inner: Mutex<Inner>,
    /// Notified after every step that moved frames (completions may be new).
    pub progress: Condvar,
    pub mode: EngineMode,
    pub stop: AtomicBool,
    pub failure: Mutex<Option<String>>,
    /// Called when the engine stops for good (see [`Engine::on_failure`]).
    failure_hooks: Mutex<Hooks>,
    /// Called when asynchronous events come to wait (see [`Engine::on_event`]).
    event_hooks: Mutex<Hooks>,
    /// The backend's fd to sleep on, and its second one (-1: none), which
    /// may come and go (the UDP backend's multicast sockets): see
    /// [`Engine::refresh_poll_fds`].
    poll_fd: std::os::fd::RawFd,
    second_poll_fd: AtomicI32,
    /// When a step last ran, in ns since `born` (the keeper reads it).
    last_step_ns: AtomicU64,
    /// Steps that moved frames, counted under the lock: a waiter that reads
    /// it under the lock before sleeping on `progress` misses no step.
    moved_steps: AtomicU64,
    /// The core clock's epoch.
    born: std::time::Instant,
}

impl Engine {
    pub fn new(inner: Inner, mode: EngineMode) -> Engine {
        let poll_fd = inner.io.poll_fd();
        let second_poll_fd = AtomicI32::new(inner.io.second_poll_fd().unwrap_or(-1));
        let born = inner.epoch;
        Engine {
            inner: Mutex::new(inner),
            progress: Condvar::new(),
            mode,
            stop: AtomicBool::new(false),
            failure: Mutex::new(None),
            failure_hooks: Mutex::new(Hooks::default()),
            event_hooks: Mutex::new(Hooks::default()),
            poll_fd,
            second_poll_fd,
            last_step_ns: AtomicU64::new(0),
            moved_steps: AtomicU64::new(0),
            born,
        }
    }

    /// The lock. A panic elsewhere while holding it leaves the core as it was
    /// at the panic; later calls go on with it rather than poison everything.
    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn failed(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn fail(&self, why: String) {
        tracing::error!("engine stopped: {why}");
        *self.failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
        self.stop.store(true, Ordering::Release);
        self.progress.notify_all();
        self.failure_hooks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .call_all();
    }

    /// Calls `hook` when the engine stops for good, or at once if it has;
    /// returns its number for [`Engine::remove_failure_hook`].
    pub fn on_failure(&self, hook: Box<dyn Fn() + Send + Sync>) -> u64 {
        let mut hooks = self.failure_hooks.lock().unwrap_or_else(|p| p.into_inner());
        if self.failed().is_some() {
            hook();
        }
        hooks.add(hook)
    }

    /// Forgets a hook of [`Engine::on_failure`]; it is not called after this.
    pub fn remove_failure_hook(&self, id: u64) {
        self.failure_hooks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
    }

    /// Calls `hook` (with the device locked: it must not lock it) after a
    /// step that found asynchronous events (core or port) waiting where none
    /// had waited since they were last all taken. Returns its number for
    /// [`Engine::remove_event_hook`].
    pub fn on_event(&self, hook: Box<dyn Fn() + Send + Sync>) -> u64 {
        self.event_hooks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .add(hook)
    }

    /// Forgets a hook of [`Engine::on_event`]; it is not called after this.
    pub fn remove_event_hook(&self, id: u64) {
        self.event_hooks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
    }

    /// Tells the event hooks of events a step found.
    fn signal_events(&self, inner: &mut Inner) {
        if std::mem::take(&mut inner.signal_events) {
            self.event_hooks
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .call_all();
        }
    }

    /// Wake completion waiters after a step that moved frames. Only
    /// thread mode has any (polling-mode waits sleep on the backend's fd),
    /// and std's futex condvar makes a futex syscall per notify whether or
    /// not anyone waits: about 2 µs per step on this VM (retpolines).
    fn notify_progress(&self) {
        if self.mode == EngineMode::Thread {
            self.progress.notify_all();
        }
    }

    /// Steps that moved frames so far (read it under the lock to pair it
    /// with a wait on `progress`).
    pub fn moved_steps(&self) -> u64 {
        self.moved_steps.load(Ordering::Acquire)
    }

    /// Records a step's outcome under the lock: when it ran (for the keeper)
    /// and whether it moved frames.
    fn note_step(&self, inner: &mut Inner, moved: bool) {
        self.count_moved(moved);
        self.mark_step(inner);
        self.signal_events(inner);
    }

    /// Counts a step that moved frames (under the lock: see `moved_steps`).
    fn count_moved(&self, moved: bool) {
        if moved {
            self.moved_steps.fetch_add(1, Ordering::Release);
        }
    }

    /// Records for the keeper when `inner` last stepped.
    fn mark_step(&self, inner: &Inner) {
        let ns = inner
            .last_wall
            .saturating_duration_since(self.born)
            .as_nanos() as u64;
        self.last_step_ns.store(ns, Ordering::Relaxed);
    }

    /// One step from a caller's thread (polling mode, or to hurry the thread).
    pub fn step_now(&self) -> usize {
        let r = {
            let mut inner = self.lock();
            let r = inner.step();
            self.note_step(&mut inner, matches!(r, Ok(n) if n > 0));
            r
        };
        match r {
            Ok(n) => {
                if n > 0 {
                    self.notify_progress();
                }
                n
            }
            Err(e) => {
                self.fail(e.to_string());
                0
            }
        }
    }

    /// One step from a caller's thread if the device is free right now
    /// (None if the engine thread holds it). Lets a waiting application
    /// thread take its own frames instead of waiting for a hand-off.
    pub fn try_step(&self) -> Option<usize> {
        let mut inner = match self.inner.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        let r = inner.step();
        self.note_step(&mut inner, matches!(r, Ok(n) if n > 0));
        match r {
            Ok(n) => {
                drop(inner);
                if n > 0 {
                    self.notify_progress();
                }
                Some(n)
            }
            Err(e) => {
                drop(inner);
                self.fail(e.to_string());
                None
            }
        }
    }

    /// Takes the backend's second fd again, after a change that may have
    /// made or removed it (a multicast join or leave).
    pub fn refresh_poll_fds(&self, inner: &Inner) {
        let fd = inner.io.second_poll_fd().unwrap_or(-1);
        self.second_poll_fd.store(fd, Ordering::Release);
    }

    /// Sleep until the backend has frames or `timeout` passes.
    pub fn wait_io(&self, timeout: Duration) {
        let second = self.second_poll_fd.load(Ordering::Acquire);
        let fds = [self.poll_fd, second];
        let fds = if second >= 0 { &fds[..] } else { &fds[..1] };
        if let Err(e) = ferroce_nic::wait_readable_any(fds, Some(timeout)) {
            self.fail(e.to_string());
        }
    }

    /// The keeper's loop (polling mode): steps the device when nobody has
    /// for [`KEEPER_PERIOD`], never waiting for the lock. Unparked to stop.
    pub fn keep(self: Arc<Self>) {
        let period_ns = KEEPER_PERIOD.as_nanos() as u64;
        while !self.stop.load(Ordering::Acquire) {
            std::thread::park_timeout(KEEPER_PERIOD);
            let now = self.born.elapsed().as_nanos() as u64;
            if now.saturating_sub(self.last_step_ns.load(Ordering::Relaxed)) >= period_ns {
                let _ = self.try_step();
            }
        }
    }

    /// The engine thread's loop.
    pub fn run(self: Arc<Self>) {
        let over = spin_override();
        let mut spin_until = self.born;
        while !self.stop.load(Ordering::Acquire) {
            let (moved, idle, now) = {
                let mut inner = self.lock();
                match inner.step() {
                    Ok(n) => {
                        self.count_moved(n > 0);
                        self.signal_events(&mut inner);
                        (n, inner.idle_timeout(), inner.last_step())
                    }
                    Err(e) => {
                        drop(inner);
                        self.fail(e.to_string());
                        return;
                    }
                }
            };
            if moved > 0 {
                self.progress.notify_all();
                let spin = poll_after_step(moved, over);
                if !spin.is_zero() {
                    spin_until = now + spin;
                }
                continue;
            }
            if now < spin_until {
                // Yield, not spin: on a core shared with the application
                // (one vCPU) it runs the application meanwhile.
                std::thread::yield_now();
                continue;
            }
            if !idle.is_zero() {
                self.wait_io(idle);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferroce_nic::{NicError, RxSink, Stats, TxFill};
    use ferroce_stack::sim::{connect, ConnectCfg, LinkConfig, Network};
    use ferroce_stack::transport::{
        AccessFlags, Config, QpCap, QpInitAttr, QpType, SendOp, SendWr, Sge, VecRegion,
    };
    use std::collections::VecDeque;

    /// A backend handing out prepared frames; for each frame sent it notes
    /// how many had been received by then.
    struct Scripted {
        rx: VecDeque<Vec<u8>>,
        received: usize,
        sent_after: std::sync::Arc<std::sync::Mutex<Vec<usize>>>,
    }

    impl PacketIo for Scripted {
        fn kind(&self) -> &'static str {
            "scripted"
        }
        fn max_frame_len(&self) -> usize {
            9018
        }
        fn mac(&self) -> [u8; 6] {
            [2, 0, 0, 0, 0, 2]
        }
        fn recv(&mut self, max: usize, sink: &mut RxSink<'_>) -> Result<usize, NicError> {
            let mut n = 0;
            while n < max {
                let Some(f) = self.rx.pop_front() else { break };
                sink(&f);
                n += 1;
                self.received += 1;
            }
            Ok(n)
        }
        fn transmit(&mut self, max: usize, fill: &mut TxFill<'_>) -> Result<usize, NicError> {
            let mut buf = vec![0u8; self.max_frame_len()];
            let mut n = 0;
            while n < max && fill(&mut buf).is_some() {
                n += 1;
                self.sent_after.lock().unwrap().push(self.received);
            }
            Ok(n)
        }
        fn poll_fd(&self) -> std::os::fd::RawFd {
            -1
        }
        fn stats(&self) -> Stats {
            Stats::default()
        }
    }

    #[test]
    fn a_backlog_is_acknowledged_as_it_is_read() {
        const IOVA: u64 = 0x1_0000_0000;
        let mut net = Network::with_config(2, LinkConfig::perfect(), 1, Config::default());
        let mut qps = Vec::new();
        let mut keys = Vec::new();
        for c in &mut net.cores {
            let pd = c.alloc_pd();
            let cq = c.create_cq(1024).unwrap();
            let region = Box::new(VecRegion::zeroed(1 << 20));
            keys.push(c.reg_mr(pd, IOVA, AccessFlags::ALL, region).unwrap());
            let attr = QpInitAttr {
                qp_type: QpType::Rc,
                send_cq: cq,
                recv_cq: cq,
                srq: None,
                cap: QpCap {
                    max_send_wr: 64,
                    max_recv_wr: 64,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_all: false,
            };
            qps.push(c.create_qp(pd, &attr).unwrap());
        }
        let cfg = ConnectCfg::default();
        connect(&mut net, 0, qps[0], 1, qps[1], QpType::Rc, &cfg, 100, 5000).unwrap();
        let mut cores = std::mem::take(&mut net.cores);
        let (b, mut a) = (cores.pop().unwrap(), cores.pop().unwrap());
        // 64 KiB WRITEs at MTU 1024 until the requester's window stops it: hundreds of
        // packets, AckReq on every 64th.
        for i in 0..16u64 {
            let sge = [Sge {
                addr: IOVA + i * 65536,
                length: 65536,
                lkey: keys[0].0,
            }];
            let op = SendOp::RdmaWrite {
                remote_addr: IOVA + i * 65536,
                rkey: keys[1].1,
            };
            a.post_send(qps[0], &SendWr::new(i, op, &sge)).unwrap();
        }
        let mut rx = VecDeque::new();
        let mut buf = vec![0u8; 9018];
        while let Some(n) = a.poll_transmit(net.now, &mut buf) {
            rx.push_back(buf[..n].to_vec());
        }
        let total = rx.len();
        assert!(total >= 4 * BATCH, "only {total} frames");
        let sent_after = std::sync::Arc::default();
        let io = Scripted {
            rx,
            received: 0,
            sent_after: std::sync::Arc::clone(&sent_after),
        };
        let mut inner = Inner::new(b, Box::new(io));
        inner.step().unwrap();
        let sent_after = sent_after.lock().unwrap().clone();
        // The responder answered while it read: its first ACK left after the first
        // batch, not after the whole backlog (a slow receiver would otherwise hold
        // every ACK for a whole step, longer than the requester's ACK time-out).
        assert!(sent_after.len() >= 2, "ACKs sent: {sent_after:?}");
        assert!(
            sent_after[0] <= BATCH,
            "first ACK after {} of {total} frames",
            sent_after[0]
        );
        assert!(
            sent_after.iter().filter(|&&r| r < total).count() >= 2,
            "{sent_after:?}"
        );
    }

    #[test]
    fn bulk_steps_keep_the_engine_polling_longer() {
        // A step that moved nothing sleeps at once.
        assert_eq!(poll_after_step(0, None), Duration::ZERO);
        // A ping-pong's steps move one or two frames: a short poll.
        assert_eq!(poll_after_step(1, None), SMALL_SPIN);
        assert_eq!(poll_after_step(2, None), SMALL_SPIN);
        assert_eq!(poll_after_step(BULK_STEP_FRAMES - 1, None), SMALL_SPIN);
        assert!(SMALL_SPIN < BULK_SPIN);
        // A GRO batch or a window of a large message.
        assert_eq!(poll_after_step(BULK_STEP_FRAMES, None), BULK_SPIN);
        assert_eq!(poll_after_step(STEP_LIMIT, None), BULK_SPIN);
        // FERROCE_ENGINE_SPIN_US applies to every step, and 0 turns polling off.
        let us = Duration::from_micros(7);
        assert_eq!(poll_after_step(1, Some(us)), us);
        assert_eq!(
            poll_after_step(STEP_LIMIT, Some(Duration::ZERO)),
            Duration::ZERO
        );
    }
}
