//! The epoch ticker: one thread per runtime that advances the engine's epoch every tick while a call is in flight.
//!
//! Compiled code checks the epoch against its store's deadline at function entries and loop back-edges, a load
//! and a compare; the ticker is what makes the epoch move. It parks while no call is in flight, so an idle
//! runtime costs no wake-ups: a call's deadline is counted in ticks from the epoch at its start, so ticks that did
//! not happen while idle change nothing.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

use wasmtime::Engine;

#[derive(Debug, Default)]
struct Shared {
    in_flight: AtomicUsize,
    stop: AtomicBool,
}

/// The ticker thread, stopped and joined on drop.
#[derive(Debug)]
pub(crate) struct Ticker {
    shared: Arc<Shared>,
    thread: Thread,
    join: Option<JoinHandle<()>>,
}

impl Ticker {
    pub(crate) fn start(engine: Engine, tick: Duration) -> std::io::Result<Self> {
        let shared = Arc::new(Shared::default());
        let theirs = Arc::clone(&shared);
        let join = thread::Builder::new().name("ward-wasm-epoch".into()).spawn(move || run(&engine, &theirs, tick))?;
        let thread = join.thread().clone();
        Ok(Self { shared, thread, join: Some(join) })
    }

    /// Marks a call in flight until the guard drops; wakes the ticker if it was idle.
    pub(crate) fn call(&self) -> InFlight<'_> {
        if self.shared.in_flight.fetch_add(1, Ordering::SeqCst) == 0 {
            self.thread.unpark();
        }
        InFlight { ticker: self }
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.thread.unpark();
        if let Some(join) = self.join.take() {
            // The thread only parks and increments; it has nothing to report, and a panic there is already printed.
            let _ = join.join();
        }
    }
}

/// A call in flight (see [`Ticker::call`]).
pub(crate) struct InFlight<'a> {
    ticker: &'a Ticker,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.ticker.shared.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

fn run(engine: &Engine, shared: &Shared, tick: Duration) {
    let mut next = Instant::now() + tick;
    loop {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        if shared.in_flight.load(Ordering::SeqCst) == 0 {
            // `park` may return spuriously; the loop looks again. A call that starts after the load above unparks
            // this thread, and an unpark before the park makes the park return at once.
            thread::park();
            next = Instant::now() + tick;
            continue;
        }
        let now = Instant::now();
        if now >= next {
            engine.increment_epoch();
            next = now + tick;
        } else {
            // Returns early on an unpark or spuriously; the deadline is kept by `next`, not by the park.
            thread::park_timeout(next - now);
        }
    }
}
