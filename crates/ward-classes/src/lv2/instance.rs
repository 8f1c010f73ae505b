//! One LV2 plugin instance under ward: its blocks, its worker's requests and responses, its state, its options.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use ward::{Arg, Callback, FaultKind, RetType};

use super::atom::{self, AtomUrids, ATOM_HEADER};
use super::{host, uri, Descriptor, LibraryInner, OptionValue, PathFeatures, PortKind, PortSpec, Setup};
use crate::adapters::ADAPTER_ERROR_BELOW;
use crate::{ClassError, Processed};

/// Bytes of worker requests or of one request's responses the adapter queues at most (its WORK_QUEUE_BYTES).
const WORK_QUEUE_BYTES: usize = 64 * 1024;
/// Bytes of worker requests the adapter holds at most, those handed out and not yet acknowledged included (its
/// WORK_QUEUE_HELD_BYTES): what one take may hand out.
const WORK_QUEUE_HELD_BYTES: usize = 2 * WORK_QUEUE_BYTES;
/// The largest state believed from a plugin's save.
const MAX_STATE: u64 = 256 << 20;
/// More ports than any plugin has (the adapter's MAX_PORTS).
const MAX_PORTS: usize = 4096;
/// The largest buffer of one port (the adapter's MAX_PORT_BYTES).
const MAX_PORT_BYTES: usize = 64 << 20;
/// The most options one get or set carries, and the largest value of one (the adapter's MAX_OPTIONS and
/// MAX_OPTION_BYTES).
const MAX_OPTIONS: usize = 1024;
const MAX_OPTION_BYTES: usize = 65536;
/// The status bits `options:interface` defines (success is none of them); any other bit is no plugin's answer.
const OPTIONS_STATUS_BITS: u32 = 0x1 | 0x2 | 0x4 | 0x8;

/// Which option a get asks for: `LV2_Options_Option`'s context, subject and key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionKey {
    /// `LV2_Options_Context`: 0 instance, 1 resource, 2 blank, 3 port.
    pub context: u32,
    pub subject: u32,
    /// A URID of the host's map (never 0: 0 ends an option list).
    pub key: u32,
}

/// What `options:interface`'s get answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// The plugin's status: 0, or `LV2_Options_Status` bits (1 unknown, 2 bad subject, 4 bad key, 8 bad value).
    pub status: u32,
    /// One per option asked, in order: its value, or `None` where the plugin gave none.
    pub values: Vec<Option<OptionValue>>,
}

/// The data of one port for one block. Audio and CV ports hold a block of samples, a control port one value (the
/// first of its slice); an atom port holds the atom with its header: for an output, the whole buffer the plugin may
/// fill (its capacity is the slice's length less the header).
#[derive(Debug)]
pub enum PortBuffer<'a> {
    /// Not connected (the plugin gets NULL, as a host that leaves an optional port alone gives it).
    Unconnected,
    Input(&'a [f32]),
    Output(&'a mut [f32]),
    AtomInput(&'a [u8]),
    AtomOutput(&'a mut [u8]),
}

/// The class's side of the worker requests' hand-over: the adapter keeps what a take handed out until a later take
/// acknowledges it, so a take whose output never came back (late) loses nothing.
struct WorkTakes {
    /// The number the next take gets: from 1, never reused for the instance (so never one a restarted domain's
    /// adapter handed out under, but for the takes its history replays, numbered as they were).
    next: u64,
    /// The number of the last take whose requests came back (0: none).
    received: u64,
    /// A take's requests did not come back: they wait in the domain, taken at the next block even if it queued none.
    owed: bool,
}

/// The packing buffers of a block, kept between blocks (see the adapter's `ward_lv2_run`).
#[derive(Default)]
struct Packing {
    input: Vec<u8>,
    output: Vec<u8>,
    /// Where each port's bytes start in `output` (`usize::MAX`: not an output, or not connected).
    output_at: Vec<usize>,
}

/// One instance of a plugin.
pub struct Instance {
    lib: Arc<LibraryInner>,
    plugin: Arc<Descriptor>,
    handle: u64,
    ports: Vec<PortSpec>,
    urids: AtomUrids,
    /// The host's way in (the core keeps a clone for as long as the domain may call it).
    _callback: Callback,
    packing: Mutex<Packing>,
    /// Worker requests the plugin scheduled, fetched from the domain, not yet taken by the host.
    scheduled: Mutex<Vec<Vec<u8>>>,
    /// The hand-over of those requests (see the adapter's `ward_lv2_take_work`).
    work_takes: Mutex<WorkTakes>,
    /// Blocks come from a real-time thread (see [`Setup::realtime`], [`Instance::set_realtime`]).
    realtime: AtomicBool,
    sample_rate: f64,
    /// Checkpoints: every this many samples (0: never), and the samples since the last.
    checkpoint_every: u64,
    since_checkpoint: AtomicU64,
    /// A save failed once: no more checkpoints for this instance (the history alone rebuilds its state).
    checkpoints_off: Arc<AtomicBool>,
    /// The thread that takes a real-time instance's checkpoints.
    checkpointer: Mutex<Option<Checkpointer>>,
    /// The period of the latest real-time block, in nanoseconds.
    period_ns: AtomicU64,
    /// Output checks (the policy's `check_output`): the last checked block's NaN or infinity was declared a fault
    /// (the next block comes from the recovered domain); the plugin wrote one again right after such a recovery,
    /// so its output is its own and passed on unchecked.
    non_finite_recovered: AtomicBool,
    output_is_its_own: AtomicBool,
    /// The path features the host offered at instantiation: what [`Instance::save`] and [`Instance::restore`] offer.
    paths: PathFeatures,
}

/// The plugin's state saved in its domain and logged as the restore that brings it back, as one step to other
/// threads (no block in between); a save that fails turns checkpoints off for the instance.
/// ward's own saves offer no path feature: the host's functions are the host's to call when it saves, and a plugin
/// without mapPath stores absolute paths, which a restart restores as they are.
fn checkpoint(lib: &LibraryInner, handle: u64, uri: &str, off: &AtomicBool) {
    let bound = usize::try_from(lib.policy.history_mb).unwrap_or(usize::MAX).saturating_mul(1 << 20);
    let taken = lib.ext.exclusively(|| -> Result<(), ClassError> {
        let blob = save_of(lib, handle, uri, PathFeatures::default())?;
        if blob.len() > bound.max(1 << 20) {
            // Kept in the shadow log, a state larger than the history may hold would hold the host's memory.
            return Err(ClassError::Refused {
                plugin: uri.to_string(),
                what: format!("its state of {} bytes is larger than history_mb allows", blob.len()),
            });
        }
        let len = blob.len() as u64;
        lib.functions
            .restore
            .record_checkpoint(&[Arg::Handle(handle), Arg::In(&blob), Arg::U64(len), Arg::U64(0)], RetType::I64)?;
        Ok(())
    });
    if let Err(e) = taken {
        off.store(true, Ordering::Relaxed);
        tracing::info!(plugin = %uri, error = %e, "saving the state failed: no more checkpoints of this instance");
    }
}

/// The state `state:interface` saves, through the adapter (see [`Instance::save`]).
fn save_of(lib: &LibraryInner, handle: u64, uri: &str, paths: PathFeatures) -> Result<Vec<u8>, ClassError> {
    let bad = |reason: String| ClassError::BadArguments { plugin: uri.to_string(), reason };
    let mut buf = vec![0u8; 64 * 1024];
    let features = u64::from(paths.wire_flags());
    for _ in 0..2 {
        let cap = buf.len() as u64;
        let value = lib
            .functions
            .save
            .call(&mut [Arg::Handle(handle), Arg::U64(features), Arg::Out(&mut buf), Arg::U64(cap)], RetType::I64)?;
        let n = value.as_i64().unwrap_or(ADAPTER_ERROR_BELOW - 1);
        if n < ADAPTER_ERROR_BELOW {
            return Err(ClassError::Refused { plugin: uri.to_string(), what: "its save failed".into() });
        }
        if n >= 0 {
            buf.truncate(n as usize);
            return Ok(buf);
        }
        let need = n.unsigned_abs();
        if need > MAX_STATE {
            return Err(bad(format!("a state of {need} bytes is beyond belief")));
        }
        buf = vec![0u8; need as usize];
    }
    Err(bad("its state keeps growing".into()))
}

/// The thread that takes a real-time instance's checkpoints when its blocks say one is due.
struct Checkpointer {
    signal: Arc<(Mutex<CheckpointerState>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct CheckpointerState {
    due: bool,
    stop: bool,
}

impl Checkpointer {
    fn start(lib: Arc<LibraryInner>, handle: u64, uri: String, off: Arc<AtomicBool>) -> Option<Checkpointer> {
        let signal = Arc::new((Mutex::new(CheckpointerState::default()), Condvar::new()));
        let theirs = Arc::clone(&signal);
        let thread = std::thread::Builder::new()
            .name("ward-checkpoint".into())
            .spawn(move || loop {
                let (lock, wake) = &*theirs;
                let mut st = lock.lock().unwrap_or_else(|e| e.into_inner());
                while !st.due && !st.stop {
                    st = wake.wait(st).unwrap_or_else(|e| e.into_inner());
                }
                if st.stop {
                    return;
                }
                st.due = false;
                drop(st);
                checkpoint(&lib, handle, &uri, &off);
            })
            .ok()?;
        Some(Checkpointer { signal, thread: Some(thread) })
    }

    fn request(&self) {
        let (lock, wake) = &*self.signal;
        lock.lock().unwrap_or_else(|e| e.into_inner()).due = true;
        wake.notify_one();
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        let (lock, wake) = &*self.signal;
        lock.lock().unwrap_or_else(|e| e.into_inner()).stop = true;
        wake.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl std::fmt::Debug for Instance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "lv2::Instance({})", self.plugin.uri)
    }
}

fn put_u32(b: &mut Vec<u8>, v: u32) {
    b.extend_from_slice(&v.to_le_bytes());
}

fn put_str(b: &mut Vec<u8>, s: &str) {
    put_u32(b, s.len() as u32);
    b.extend_from_slice(s.as_bytes());
}

/// Records as the adapter queues them (u32 size, bytes), bounds-checked: the bytes come from the domain.
fn records(bytes: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let head = bytes.get(at..at + 4).ok_or("a record header runs past the end")?;
        let n = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let body = bytes.get(at + 4..at + 4 + n).ok_or_else(|| format!("a record of {n} bytes runs past the end"))?;
        out.push(body.to_vec());
        at += 4 + n;
    }
    Ok(out)
}

impl Instance {
    pub(super) fn create(
        lib: Arc<LibraryInner>,
        plugin: Arc<Descriptor>,
        setup: Setup,
    ) -> Result<Instance, ClassError> {
        let refused = |what: String| ClassError::Refused { plugin: plugin.uri.clone(), what };
        if setup.ports.len() > MAX_PORTS {
            return Err(refused(format!("its bundle declares {} ports", setup.ports.len())));
        }
        if !(setup.sample_rate.is_finite() && setup.sample_rate > 0.0) {
            return Err(ClassError::BadArguments {
                plugin: plugin.uri.clone(),
                reason: format!("a sample rate of {}", setup.sample_rate),
            });
        }
        let f = &setup.features;
        let urids = if f.urid_map {
            AtomUrids { sequence: setup.host.map(uri::ATOM_SEQUENCE), frame_time: setup.host.map(uri::ATOM_FRAME_TIME) }
        } else {
            AtomUrids::default()
        };
        let mut packed = Vec::new();
        put_u32(&mut packed, f.wire_flags());
        put_u32(&mut packed, lib.policy.read_past_input_kb);
        let mut bundle = setup.bundle.to_string_lossy().into_owned();
        if !bundle.ends_with('/') {
            bundle.push('/');
        }
        put_str(&mut packed, &bundle);
        put_u32(&mut packed, setup.ports.len() as u32);
        for p in &setup.ports {
            put_u32(&mut packed, p.wire_kind());
            put_u32(&mut packed, u32::from(p.output));
        }
        let options = f.options.as_deref().unwrap_or_default();
        put_u32(&mut packed, options.len() as u32);
        for o in options {
            for v in [o.context, o.subject, o.key, o.value_type, o.value.len() as u32] {
                put_u32(&mut packed, v);
            }
            packed.extend_from_slice(&o.value);
        }
        put_u32(&mut packed, f.flags.len() as u32);
        for flag in &f.flags {
            put_str(&mut packed, flag);
        }
        let callback = host::callback(Arc::clone(&setup.host))?;
        let len = packed.len() as u64;
        let value = lib.functions.instantiate.call(
            &mut [
                Arg::Handle(lib.library),
                Arg::U64(plugin.index as u64),
                Arg::In(&packed),
                Arg::U64(len),
                Arg::Callback(&callback),
                Arg::F64(setup.sample_rate),
            ],
            RetType::Handle,
        )?;
        let handle = match value.as_handle() {
            Some(h) if h != 0 => h,
            _ => return Err(refused(format!("instantiate at {} Hz returned NULL", setup.sample_rate))),
        };
        let every = lib.policy.checkpoint;
        let checkpoint_every =
            if plugin.has_state { (every.as_secs_f64() * setup.sample_rate).round() as u64 } else { 0 };
        let checkpoints_off = Arc::new(AtomicBool::new(false));
        let checkpointer = (setup.realtime && checkpoint_every > 0)
            .then(|| Checkpointer::start(Arc::clone(&lib), handle, plugin.uri.clone(), Arc::clone(&checkpoints_off)))
            .flatten();
        Ok(Instance {
            lib,
            plugin,
            handle,
            ports: setup.ports,
            urids,
            _callback: callback,
            packing: Mutex::new(Packing::default()),
            scheduled: Mutex::new(Vec::new()),
            work_takes: Mutex::new(WorkTakes { next: 1, received: 0, owed: false }),
            realtime: AtomicBool::new(setup.realtime),
            sample_rate: setup.sample_rate,
            checkpoint_every,
            since_checkpoint: AtomicU64::new(0),
            checkpoints_off,
            checkpointer: Mutex::new(checkpointer),
            period_ns: AtomicU64::new(0),
            non_finite_recovered: AtomicBool::new(false),
            output_is_its_own: AtomicBool::new(false),
            paths: setup.features.paths,
        })
    }

    pub fn descriptor(&self) -> &Arc<Descriptor> {
        &self.plugin
    }

    /// From now on blocks come from a real-time thread (a host that did not say so at instantiation, found running
    /// the plugin on a thread the kernel schedules in real time): see [`Setup::realtime`].
    pub fn set_realtime(&self) {
        if self.realtime.swap(true, Ordering::Relaxed) || self.checkpoint_every == 0 {
            return;
        }
        let mut slot = self.checkpointer.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_none() {
            *slot = Checkpointer::start(
                Arc::clone(&self.lib),
                self.handle,
                self.plugin.uri.clone(),
                Arc::clone(&self.checkpoints_off),
            );
        }
    }

    /// Whether blocks come from a real-time thread.
    pub fn is_realtime(&self) -> bool {
        self.realtime.load(Ordering::Relaxed)
    }

    /// The ports the instance was created with.
    pub fn ports(&self) -> &[PortSpec] {
        &self.ports
    }

    /// Activate the instance. A disabled plugin is activated as far as the host can tell (it is bypassed).
    pub fn activate(&self) -> Result<Processed, ClassError> {
        self.simple(&self.lib.functions.activate)
    }

    pub fn deactivate(&self) -> Result<Processed, ClassError> {
        self.simple(&self.lib.functions.deactivate)
    }

    fn simple(&self, f: &ward::Function) -> Result<Processed, ClassError> {
        match f.call(&mut [Arg::Handle(self.handle)], RetType::I64) {
            Ok(_) => Ok(Processed::Ran),
            Err(e) => Ok(self.degraded(e)),
        }
    }

    fn bad(&self, reason: String) -> ClassError {
        ClassError::BadArguments { plugin: self.plugin.uri.clone(), reason }
    }

    /// Check that each port's buffer fits its kind and direction; (bytes of its buffer, bytes sent) per port.
    fn layout(&self, samples: usize, ports: &[PortBuffer<'_>]) -> Result<Vec<(usize, usize)>, ClassError> {
        if ports.len() != self.ports.len() {
            return Err(self.bad(format!("{} buffers for {} ports", ports.len(), self.ports.len())));
        }
        if samples.saturating_mul(4) > MAX_PORT_BYTES {
            return Err(self.bad(format!("a block of {samples} samples")));
        }
        let mut sizes = Vec::with_capacity(ports.len());
        for (i, (spec, buf)) in self.ports.iter().zip(ports).enumerate() {
            let wrong = |what: &str| self.bad(format!("port {i} is {:?} {}, given {what}", spec.kind, dir(spec)));
            let size = match (spec.kind, buf) {
                (_, PortBuffer::Unconnected) => (0, 0),
                (PortKind::Audio | PortKind::Cv, PortBuffer::Input(s)) if !spec.output => {
                    if s.len() < samples {
                        return Err(self.bad(format!("port {i} needs {samples} samples, got {}", s.len())));
                    }
                    (samples * 4, samples * 4)
                }
                (PortKind::Audio | PortKind::Cv, PortBuffer::Output(s)) if spec.output => {
                    if s.len() < samples {
                        return Err(self.bad(format!("port {i} needs {samples} samples, got {}", s.len())));
                    }
                    (samples * 4, samples * 4)
                }
                (PortKind::Control, PortBuffer::Input(s)) if !spec.output && !s.is_empty() => (4, 4),
                (PortKind::Control, PortBuffer::Output(s)) if spec.output && !s.is_empty() => (4, 4),
                (PortKind::Atom, PortBuffer::AtomInput(s)) if !spec.output => {
                    if s.len() < ATOM_HEADER {
                        return Err(self.bad(format!("port {i}'s atom is {} bytes, shorter than a header", s.len())));
                    }
                    let size = u32::from_le_bytes([s[0], s[1], s[2], s[3]]) as usize;
                    let total = ATOM_HEADER.saturating_add(size);
                    if total > s.len() || total > MAX_PORT_BYTES {
                        return Err(self.bad(format!("port {i}'s atom claims {size} bytes in a buffer of {}", s.len())));
                    }
                    (total, total)
                }
                (PortKind::Atom, PortBuffer::AtomOutput(s)) if spec.output => {
                    if s.len() < ATOM_HEADER || s.len() > MAX_PORT_BYTES {
                        return Err(self.bad(format!("port {i}'s atom buffer is {} bytes", s.len())));
                    }
                    (s.len(), ATOM_HEADER)
                }
                (_, PortBuffer::Input(_)) => return Err(wrong("an input of samples")),
                (_, PortBuffer::Output(_)) => return Err(wrong("an output of samples")),
                (_, PortBuffer::AtomInput(_)) => return Err(wrong("an input atom")),
                (_, PortBuffer::AtomOutput(_)) => return Err(wrong("an output atom")),
            };
            sizes.push(size);
        }
        Ok(sizes)
    }

    /// Run one block of `samples` samples; `ports` has one buffer per port, in port order. Outputs come back only
    /// when the block succeeded; an atom a plugin wrote is checked first (a malformed one is a fault, recovered and
    /// the block retried, as a crash is). Requests the block scheduled wait in [`Instance::take_work`].
    pub fn run(&self, samples: usize, ports: &mut [PortBuffer<'_>]) -> Result<Processed, ClassError> {
        let sizes = self.layout(samples, ports)?;
        let mut packing = self.packing.lock().unwrap_or_else(|e| e.into_inner());
        let policy = self.lib.policy;
        let mut attempts = 0;
        loop {
            attempts += 1;
            // Packed for every attempt: the history keeps the input packing buffer of the last one.
            pack(&mut packing, ports, &sizes, &self.ports);
            let code = match self.call_block(&mut packing, samples) {
                Err(e) => {
                    self.bypass(samples, ports);
                    return Ok(self.degraded(e));
                }
                Ok(code) => code,
            };
            if code < 0 {
                return Err(self.bad(format!("the adapter refused the block (code {code})")));
            }
            let mut wrong = self.check_atoms(&packing, samples, &sizes);
            if wrong.is_none() && policy.check_output && !self.output_is_its_own.load(Ordering::Relaxed) {
                wrong = self.non_finite_output(&packing, samples);
                let recovered_for_it = self.non_finite_recovered.swap(wrong.is_some(), Ordering::Relaxed);
                if let (Some(what), true) = (&wrong, recovered_for_it) {
                    // Again on the recovered domain's first checked block: the plugin does so natively too.
                    self.output_is_its_own.store(true, Ordering::Relaxed);
                    self.lib.ext.report_own_output("ward_lv2_run", what);
                    wrong = None;
                }
            }
            if let Some(what) = wrong {
                let kind = FaultKind::BadOutput { what: what.clone() };
                if self.is_realtime() {
                    // Not retried on the real-time thread: recovered apart, the block bypassed.
                    let _ = self.lib.ext.declare_fault_apart("ward_lv2_run", kind);
                } else if self.lib.ext.declare_fault("ward_lv2_run", kind).is_ok() && attempts <= policy.max_retries {
                    continue;
                }
                self.bypass(samples, ports);
                return Ok(Processed::Bypassed { reason: format!("output check failed: {what}") });
            }
            if code > 0 || self.work_takes.lock().unwrap_or_else(|e| e.into_inner()).owed {
                self.fetch_work(code as usize);
            }
            unpack(&packing, ports, &sizes);
            drop(packing);
            self.count_towards_checkpoint(samples);
            return Ok(Processed::Ran);
        }
    }

    fn call_block(&self, packing: &mut Packing, samples: usize) -> Result<i64, ward::Error> {
        let Packing { input, output, .. } = packing;
        let (in_len, out_len) = (input.len() as u64, output.len() as u64);
        let mut args = [
            Arg::Handle(self.handle),
            Arg::U64(samples as u64),
            // The history keeps this buffer itself, not a copy of it (the next attempt or block is packed anew).
            Arg::InVec(input),
            Arg::U64(in_len),
            Arg::Out(output),
            Arg::U64(out_len),
        ];
        let value = if self.is_realtime() {
            let period = Duration::from_secs_f64(samples.max(1) as f64 / self.sample_rate);
            self.period_ns.store(period.as_nanos() as u64, Ordering::Relaxed);
            self.lib.functions.run.call_realtime(&mut args, RetType::I64, period)?
        } else {
            self.lib.functions.run.call(&mut args, RetType::I64)?
        };
        Ok(value.as_i64().unwrap_or(ADAPTER_ERROR_BELOW - 1))
    }

    /// A call the host makes from its audio thread beside the block (a worker's response, fetching the requests a
    /// block queued): real-time like the block for a real-time instance (within the last block's period).
    fn audio_thread_call(&self, f: &ward::Function, args: &mut [Arg<'_>]) -> Result<ward::Value, ward::Error> {
        if self.is_realtime() {
            let period = Duration::from_nanos(self.period_ns.load(Ordering::Relaxed).max(1_000_000));
            f.call_realtime(args, RetType::I64, period)
        } else {
            f.call(args, RetType::I64)
        }
    }

    /// A block of `samples` ran: take a checkpoint when one is due (on the checkpointer's thread for a real-time
    /// instance, else here, between two blocks).
    fn count_towards_checkpoint(&self, samples: usize) {
        if self.checkpoint_every == 0 || self.checkpoints_off.load(Ordering::Relaxed) {
            return;
        }
        let since = self.since_checkpoint.fetch_add(samples as u64, Ordering::Relaxed) + samples as u64;
        if since < self.checkpoint_every {
            return;
        }
        self.since_checkpoint.store(0, Ordering::Relaxed);
        let checkpointer = self.checkpointer.lock().unwrap_or_else(|e| e.into_inner());
        match &*checkpointer {
            Some(c) => c.request(),
            None => {
                drop(checkpointer);
                checkpoint(&self.lib, self.handle, &self.plugin.uri, &self.checkpoints_off)
            }
        }
    }

    /// What is wrong with the first malformed atom output, if one is.
    /// `sizes` is the block's layout: the bytes of each port's buffer (an atom output's capacity and header).
    fn check_atoms(&self, packing: &Packing, samples: usize, sizes: &[(usize, usize)]) -> Option<String> {
        for (i, spec) in self.ports.iter().enumerate() {
            let at = packing.output_at[i];
            if spec.kind != PortKind::Atom || !spec.output || at == usize::MAX {
                continue;
            }
            let len = sizes[i].0;
            let buffer = &packing.output[at..at + len];
            if let Err(what) = atom::check_output(buffer, len - ATOM_HEADER, samples, self.urids) {
                return Some(format!("{} wrote a malformed atom to port {i}: {what}", self.plugin.uri));
            }
        }
        None
    }

    /// The first non-finite audio output sample, described (the policy's `check_output`).
    fn non_finite_output(&self, packing: &Packing, samples: usize) -> Option<String> {
        for (i, spec) in self.ports.iter().enumerate() {
            let at = packing.output_at[i];
            if spec.kind != PortKind::Audio || !spec.output || at == usize::MAX {
                continue;
            }
            let bytes = &packing.output[at..at + samples * 4];
            if let Some(s) = crate::samples::first_non_finite(bytes) {
                return Some(format!("{} wrote a NaN or infinity to port {i} at sample {s}", self.plugin.uri));
            }
        }
        None
    }

    /// Fetch the worker requests the block left in the domain (`queued` bytes of them new), and any an earlier take
    /// handed out whose output never came back.
    fn fetch_work(&self, queued: usize) {
        let mut takes = self.work_takes.lock().unwrap_or_else(|e| e.into_inner());
        let take = takes.next;
        takes.next += 1;
        // Owed: what the lost take handed out comes again with the new ones.
        let mut buf = vec![0u8; if takes.owed { WORK_QUEUE_HELD_BYTES } else { queued.min(WORK_QUEUE_BYTES) }];
        let cap = buf.len() as u64;
        let taken = self.audio_thread_call(
            &self.lib.functions.take_work,
            &mut [
                Arg::Handle(self.handle),
                Arg::Out(&mut buf),
                Arg::U64(cap),
                Arg::U64(takes.received),
                Arg::U64(take),
            ],
        );
        let n = match taken.map(|v| v.as_i64()) {
            Ok(Some(n)) if n >= 0 && n as usize <= buf.len() => n as usize,
            Ok(_) => {
                // More than this buffer holds (the lost take's and new ones): all of them at the next block.
                takes.owed = true;
                return;
            }
            Err(e) => {
                takes.owed = true;
                tracing::debug!(plugin = %self.plugin.uri, error = %e, "worker requests left in the domain for now");
                return;
            }
        };
        takes.received = take;
        takes.owed = false;
        drop(takes);
        match records(&buf[..n]) {
            Ok(requests) => self.scheduled.lock().unwrap_or_else(|e| e.into_inner()).extend(requests),
            Err(what) => {
                let what = format!("{} queued malformed worker requests: {what}", self.plugin.uri);
                let _ = self.lib.ext.declare_fault("ward_lv2_take_work", FaultKind::BadOutput { what });
            }
        }
    }

    /// The worker requests the plugin scheduled since the last call, oldest first: the host runs each through
    /// [`Instance::work`] (on its worker thread, or at once) as it would natively.
    pub fn take_work(&self) -> Vec<Vec<u8>> {
        std::mem::take(&mut *self.scheduled.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Run the plugin's `work` on one request; the responses it gave, in order, for [`Instance::work_response`]
    /// before the next block. A plugin that fails in `work` is recovered; the request is then lost (an empty list),
    /// as a host whose worker failed would drop it.
    pub fn work(&self, request: &[u8]) -> Result<Vec<Vec<u8>>, ClassError> {
        if !self.plugin.has_worker {
            return Err(self.bad("the plugin has no worker interface".into()));
        }
        if request.len() > WORK_QUEUE_BYTES {
            return Err(self.bad(format!("a worker request of {} bytes", request.len())));
        }
        let mut out = vec![0u8; WORK_QUEUE_BYTES];
        let (len, cap) = (request.len() as u64, out.len() as u64);
        let value = self.lib.functions.work.call(
            &mut [Arg::Handle(self.handle), Arg::In(request), Arg::U64(len), Arg::Out(&mut out), Arg::U64(cap)],
            RetType::I64,
        );
        let n = match value {
            Ok(v) => v.as_i64().unwrap_or(-1),
            Err(e) => {
                tracing::debug!(plugin = %self.plugin.uri, error = %e, "worker request dropped");
                return Ok(Vec::new());
            }
        };
        if n < 0 || n as usize > out.len() {
            return Err(self.bad(format!("the adapter refused the worker request (code {n})")));
        }
        records(&out[..n as usize]).map_err(|what| self.bad(format!("malformed worker responses: {what}")))
    }

    /// Deliver one response of [`Instance::work`] to the plugin (before its next block).
    pub fn work_response(&self, response: &[u8]) -> Result<Processed, ClassError> {
        if response.len() > WORK_QUEUE_BYTES {
            return Err(self.bad(format!("a worker response of {} bytes", response.len())));
        }
        let len = response.len() as u64;
        match self.audio_thread_call(
            &self.lib.functions.work_response,
            &mut [Arg::Handle(self.handle), Arg::In(response), Arg::U64(len)],
        ) {
            Ok(_) => Ok(Processed::Ran),
            Err(e) => Ok(self.degraded(e)),
        }
    }

    /// Run every request scheduled so far through the worker and deliver its responses at once: the worker of a host
    /// that has no thread for it.
    pub fn work_now(&self) -> Result<(), ClassError> {
        for request in self.take_work() {
            for response in self.work(&request)? {
                self.work_response(&response)?;
            }
        }
        Ok(())
    }

    /// The plugin's state (`state:interface` save), as property records (u32 key, type, flags, size; the value
    /// padded to 8 bytes), for [`Instance::restore`].
    /// The plugin gets the path features [`Features::paths`](super::Features::paths) offered at instantiation.
    pub fn save(&self) -> Result<Vec<u8>, ClassError> {
        self.save_offering(self.paths)
    }

    /// [`Instance::save`] offering the plugin the path features `paths` (a host that offers them per save, as lilv
    /// does): the plugin's calls reach the [`Host`](super::Host)'s path functions.
    pub fn save_offering(&self, paths: PathFeatures) -> Result<Vec<u8>, ClassError> {
        if !self.plugin.has_state {
            return Err(self.bad("the plugin has no state interface".into()));
        }
        save_of(&self.lib, self.handle, &self.plugin.uri, paths)
    }

    /// Restore a state [`Instance::save`] gave, offering the path features offered at instantiation. The last
    /// restore is replayed after a restart.
    pub fn restore(&self, state: &[u8]) -> Result<Processed, ClassError> {
        self.restore_offering(state, self.paths)
    }

    /// [`Instance::restore`] offering the plugin the path features `paths`. Replayed after a restart, it offers them
    /// again: the host's path functions must answer for as long as the instance lives.
    pub fn restore_offering(&self, state: &[u8], paths: PathFeatures) -> Result<Processed, ClassError> {
        if !self.plugin.has_state {
            return Err(self.bad("the plugin has no state interface".into()));
        }
        let len = state.len() as u64;
        let features = u64::from(paths.wire_flags());
        match self
            .lib
            .functions
            .restore
            .call(&mut [Arg::Handle(self.handle), Arg::In(state), Arg::U64(len), Arg::U64(features)], RetType::I64)
        {
            Ok(v) if v.as_i64() == Some(0) => Ok(Processed::Ran),
            Ok(_) => Err(ClassError::Refused { plugin: self.plugin.uri.clone(), what: "its restore failed".into() }),
            Err(e) => Ok(self.degraded(e)),
        }
    }

    /// `options:interface`'s get: the values of the options `asked`, copied out of the domain. An answer no plugin
    /// gives (a value beyond 64 KiB, NULL with a size, a value without a type, an unknown status bit) is a fault: the
    /// plugin is recovered and asked again (as often as `max_retries` allows), then the get fails.
    pub fn get_options(&self, asked: &[OptionKey]) -> Result<Options, ClassError> {
        if !self.plugin.has_options {
            return Err(self.bad("the plugin has no options interface".into()));
        }
        if asked.len() > MAX_OPTIONS || asked.iter().any(|k| k.key == 0) {
            return Err(self.bad(format!("a get of {} options, or of key 0", asked.len())));
        }
        let mut request = Vec::with_capacity(4 + 12 * asked.len());
        put_u32(&mut request, asked.len() as u32);
        for k in asked {
            for w in [k.context, k.subject, k.key] {
                put_u32(&mut request, w);
            }
        }
        let mut attempts = 0;
        loop {
            attempts += 1;
            let what = match self.get_options_once(&request, asked) {
                Ok(Ok(options)) => return Ok(options),
                Ok(Err(what)) => what,
                Err(e) => return Err(e),
            };
            let what = format!("{} answered options:interface's get implausibly: {what}", self.plugin.uri);
            let kind = FaultKind::BadOutput { what: what.clone() };
            if self.lib.ext.declare_fault("ward_lv2_get_options", kind).is_err()
                || attempts > self.lib.policy.max_retries
            {
                return Err(ClassError::Refused { plugin: self.plugin.uri.clone(), what });
            }
        }
    }

    /// One get: the options, or what is implausible about the answer.
    fn get_options_once(&self, request: &[u8], asked: &[OptionKey]) -> Result<Result<Options, String>, ClassError> {
        let mut out = vec![0u8; 8 + asked.len() * 16 + 256];
        for _ in 0..2 {
            let (len, cap) = (request.len() as u64, out.len() as u64);
            let value = self.lib.functions.get_options.call(
                &mut [Arg::Handle(self.handle), Arg::In(request), Arg::U64(len), Arg::Out(&mut out), Arg::U64(cap)],
                RetType::I64,
            )?;
            let n = value.as_i64().unwrap_or(ADAPTER_ERROR_BELOW - 1);
            if n < ADAPTER_ERROR_BELOW {
                return Ok(Err(format!("a value larger than {MAX_OPTION_BYTES} bytes, or NULL with a size")));
            }
            if n >= 0 {
                out.truncate(n as usize);
                return Ok(parse_options(&out, asked));
            }
            let need = n.unsigned_abs() as usize;
            if need > 8 + asked.len() * (8 + MAX_OPTION_BYTES) {
                return Ok(Err(format!("{need} bytes of answers to {} options", asked.len())));
            }
            out = vec![0u8; need];
        }
        Ok(Err("its answer keeps growing".into()))
    }

    /// `options:interface`'s set: the options copied into the domain, the plugin's status back (0, or
    /// `LV2_Options_Status` bits). A set is state: replayed after a restart, in order with the restores and sets
    /// around it; a later set of the same keys replaces it in the shadow log.
    pub fn set_options(&self, options: &[OptionValue]) -> Result<u32, ClassError> {
        if !self.plugin.has_options {
            return Err(self.bad("the plugin has no options interface".into()));
        }
        if options.len() > MAX_OPTIONS || options.iter().any(|o| o.key == 0 || o.value.len() > MAX_OPTION_BYTES) {
            return Err(self.bad(format!(
                "a set of {} options, of key 0 or a value beyond {MAX_OPTION_BYTES} bytes",
                options.len()
            )));
        }
        let mut packed = Vec::new();
        put_u32(&mut packed, options.len() as u32);
        // The keys set, named by one number for the shadow log (FNV-1a over context, subject and key of each).
        let mut keys: u64 = 0xcbf2_9ce4_8422_2325;
        for o in options {
            for w in [o.context, o.subject, o.key] {
                for b in w.to_le_bytes() {
                    keys = (keys ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
                }
            }
            for w in [o.context, o.subject, o.key, o.value_type, o.value.len() as u32] {
                put_u32(&mut packed, w);
            }
            packed.extend_from_slice(&o.value);
        }
        let len = packed.len() as u64;
        let value = match self
            .lib
            .functions
            .set_options
            .call(&mut [Arg::Handle(self.handle), Arg::U64(keys), Arg::In(&packed), Arg::U64(len)], RetType::I64)
        {
            Ok(v) => v.as_i64().unwrap_or(ADAPTER_ERROR_BELOW - 1),
            Err(e) => {
                tracing::debug!(plugin = %self.plugin.uri, error = %e, "options not set");
                return Err(ClassError::Refused {
                    plugin: self.plugin.uri.clone(),
                    what: format!("options:interface's set failed: {e}"),
                });
            }
        };
        match u32::try_from(value) {
            Ok(status) if status & !OPTIONS_STATUS_BITS == 0 => Ok(status),
            _ if value < ADAPTER_ERROR_BELOW => Err(self.bad(format!("the adapter refused the set (code {value})"))),
            _ => {
                let what = format!("{} answered options:interface's set with status {value:#x}", self.plugin.uri);
                let _ = self.lib.ext.declare_fault("ward_lv2_set_options", FaultKind::BadOutput { what: what.clone() });
                Err(ClassError::Refused { plugin: self.plugin.uri.clone(), what })
            }
        }
    }

    /// The class's fallback for a block the plugin cannot process: the i-th audio input to the i-th audio output,
    /// other audio and CV outputs silent, control outputs as they are, atom outputs empty sequences.
    fn bypass(&self, samples: usize, ports: &mut [PortBuffer<'_>]) {
        let inputs: Vec<usize> =
            (0..self.ports.len()).filter(|&i| self.ports[i].kind == PortKind::Audio && !self.ports[i].output).collect();
        let mut next_input = 0;
        for i in 0..self.ports.len() {
            let spec = self.ports[i];
            match spec.kind {
                PortKind::Audio if spec.output => {
                    let source: Option<Vec<f32>> = inputs.get(next_input).and_then(|&k| match &ports[k] {
                        PortBuffer::Input(s) => Some(s[..samples].to_vec()),
                        _ => None,
                    });
                    next_input += 1;
                    if let PortBuffer::Output(out) = &mut ports[i] {
                        match source {
                            Some(src) => out[..samples].copy_from_slice(&src),
                            None => out[..samples].fill(0.0),
                        }
                    }
                }
                PortKind::Cv if spec.output => {
                    if let PortBuffer::Output(out) = &mut ports[i] {
                        out[..samples].fill(0.0);
                    }
                }
                PortKind::Atom if spec.output => {
                    if let PortBuffer::AtomOutput(out) = &mut ports[i] {
                        let empty = atom::empty_sequence(self.urids);
                        if out.len() >= empty.len() {
                            out[..empty.len()].copy_from_slice(&empty);
                        }
                    }
                }
                _ => {}
            }
        }
    }

    /// A call failed even after recovery (or the plugin is disabled): say so and go on.
    fn degraded(&self, e: ward::Error) -> Processed {
        tracing::debug!(plugin = %self.plugin.uri, error = %e, "bypassed");
        Processed::Bypassed { reason: e.to_string() }
    }
}

/// A get's answer as the adapter writes it (u32 status, u32 count, then u32 type, u32 size and the value per option),
/// bounds-checked: the bytes come from the domain. An implausible answer is said.
fn parse_options(bytes: &[u8], asked: &[OptionKey]) -> Result<Options, String> {
    let mut at = 0;
    let mut word = || -> Result<u32, String> {
        let w = bytes.get(at..at + 4).ok_or("the answer ends early")?;
        at += 4;
        Ok(u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
    };
    let status = word()?;
    let count = word()? as usize;
    if status & !OPTIONS_STATUS_BITS != 0 {
        return Err(format!("status {status:#x}"));
    }
    if count != asked.len() {
        return Err(format!("{count} answers to {} options", asked.len()));
    }
    let mut values = Vec::with_capacity(count);
    for k in asked {
        let mut word = || -> Result<u32, String> {
            let w = bytes.get(at..at + 4).ok_or("the answer ends early")?;
            at += 4;
            Ok(u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        };
        let (value_type, size) = (word()?, word()? as usize);
        if size > MAX_OPTION_BYTES {
            return Err(format!("a value of {size} bytes"));
        }
        let value = bytes.get(at..at + size).ok_or("a value runs past the end")?.to_vec();
        at += size;
        values.push(match (value_type, size) {
            (0, 0) => None,
            (0, _) => return Err(format!("a value of {size} bytes without a type for key {}", k.key)),
            _ => Some(OptionValue { context: k.context, subject: k.subject, key: k.key, value_type, value }),
        });
    }
    if at != bytes.len() {
        return Err(format!("{} bytes after the answers", bytes.len() - at));
    }
    Ok(Options { status, values })
}

fn dir(spec: &PortSpec) -> &'static str {
    if spec.output {
        "output"
    } else {
        "input"
    }
}

/// The layout and every port's bytes into the input packing buffer; room in the output one for the outputs.
///
/// A port of samples or a value is sent without its trailing zeros (the adapter zeroes the rest of a port sent
/// short): a silent block, or an output the host cleared, costs its header only, and any other block one look at
/// its last sample.
fn pack(packing: &mut Packing, ports: &[PortBuffer<'_>], sizes: &[(usize, usize)], specs: &[PortSpec]) {
    let Packing { input, output, output_at } = packing;
    input.clear();
    output_at.clear();
    let floats = |buf: &PortBuffer<'_>, sent: usize| -> Option<usize> {
        let s: &[f32] = match buf {
            PortBuffer::Input(s) => s,
            PortBuffer::Output(s) => s,
            _ => return None,
        };
        let s = &s[..sent / 4];
        Some(crate::samples::without_trailing_zeros(s))
    };
    for (buf, &(bytes, sent)) in ports.iter().zip(sizes) {
        let sent = floats(buf, sent).map_or(sent, |n| n * 4);
        input.extend_from_slice(&(bytes as u32).to_le_bytes());
        input.extend_from_slice(&(sent as u32).to_le_bytes());
    }
    let mut out_len = 0;
    for (i, ((buf, &(bytes, sent)), spec)) in ports.iter().zip(sizes).zip(specs).enumerate() {
        // What the header above says is sent of this port.
        let header = [input[8 * i + 4], input[8 * i + 5], input[8 * i + 6], input[8 * i + 7]];
        let trimmed = (u32::from_le_bytes(header) as usize).min(sent) / 4;
        match buf {
            PortBuffer::Unconnected => {}
            PortBuffer::Input(s) => input.extend_from_slice(bytemuck::cast_slice(&s[..trimmed])),
            PortBuffer::Output(s) => input.extend_from_slice(bytemuck::cast_slice(&s[..trimmed])),
            PortBuffer::AtomInput(s) => input.extend_from_slice(&s[..sent]),
            PortBuffer::AtomOutput(s) => {
                // The capacity in the size, as LV2 asks a host to set it; the type as the host left it.
                input.extend_from_slice(&((s.len() - ATOM_HEADER) as u32).to_le_bytes());
                input.extend_from_slice(&s[4..8]);
            }
        }
        if spec.output && bytes != 0 {
            output_at.push(out_len);
            out_len += bytes;
        } else {
            output_at.push(usize::MAX);
        }
    }
    output.resize(out_len, 0);
}

/// The outputs from the packing buffer back into the host's memory: samples and values whole, an atom as far as it
/// goes (checked before).
fn unpack(packing: &Packing, ports: &mut [PortBuffer<'_>], sizes: &[(usize, usize)]) {
    for ((buf, &(bytes, _)), &at) in ports.iter_mut().zip(sizes).zip(&packing.output_at) {
        if at == usize::MAX {
            continue;
        }
        let from = &packing.output[at..at + bytes];
        match buf {
            PortBuffer::Output(s) => bytemuck::cast_slice_mut::<f32, u8>(&mut s[..bytes / 4]).copy_from_slice(from),
            PortBuffer::AtomOutput(s) => {
                let size = u32::from_le_bytes([from[0], from[1], from[2], from[3]]) as usize;
                let total = (ATOM_HEADER + size).min(bytes);
                s[..total].copy_from_slice(&from[..total]);
            }
            _ => {}
        }
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        // The checkpointer first: it calls into the instance.
        let checkpointer = self.checkpointer.get_mut().unwrap_or_else(|e| e.into_inner()).take();
        drop(checkpointer);
        // A failure here leaves nothing behind in the host: the domain's memory goes with it.
        let _ = self.lib.functions.cleanup.call(&mut [Arg::Handle(self.handle)], RetType::I64);
    }
}
