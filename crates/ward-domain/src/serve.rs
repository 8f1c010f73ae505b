//! The serving loop of one incarnation: take requests off the request ring, run them, answer on the reply ring.
//!
//! Calls nest both ways: an extension calling a host callback lands in a stub ([`ward_abi::callback_stub`]) whose
//! dispatcher sends a `Callback` record and then serves requests (nested calls from the host's callback) until the
//! matching `CallbackReply` arrives. The state lives in a thread-local and is borrowed only between calls, never
//! across one, so re-entry is safe.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::process::ExitCode;
use std::sync::atomic::Ordering;

use ward_abi::{ArgPacker, RegArgs, RegRet};
use ward_xpc::arena::view::{Access, Lent};
use ward_xpc::arena::{BlockRef, POOL_ARENA};
use ward_xpc::batch::BatchView;
use ward_xpc::pool::RichPtr;
use ward_xpc::ring::{Consumer, Producer, MAX_RECORD};
use ward_xpc::wire::{emit_reply, ArgKind, CallView, Message, Op, RetKind, Status, WireArg, REPLY_LEN};

use crate::args::ExtensionArg;
use crate::fault_handler::CURRENT_CALL;
use crate::loader::Callee;
use crate::Setup;

struct Server {
    setup: Setup,
    requests: Consumer,
    replies: Producer,
    spin: u32,
    /// The last request said the host hands its processor over for each call (`FLAG_HAND_OVER`): this process then
    /// runs on the caller's processor, where spinning for the next request would only keep the caller from running.
    hand_over: bool,
    next_callback_id: u64,
    /// Calls that came while this process waited for a callback's answer and were not made from inside that
    /// callback (it came from a deferred call the host had not yet seen run): they run at the top level, oldest
    /// first, before anything newer on the ring, so calls run in the order the host made them.
    held: VecDeque<Vec<u8>>,
}

thread_local! {
    static SERVER: RefCell<Option<Server>> = const { RefCell::new(None) };
}

pub fn run(setup: Setup) -> ExitCode {
    let (requests, replies) = setup.region.domain_endpoints();
    let spin = setup.args.spin;
    SERVER.with(|s| {
        *s.borrow_mut() = Some(Server {
            setup,
            requests,
            replies,
            spin,
            hand_over: false,
            next_callback_id: 1,
            held: VecDeque::new(),
        })
    });
    ward_abi::set_callback_dispatch(on_callback);
    match serve_until(None) {
        Ok(_) => ExitCode::SUCCESS,
        Err(why) => {
            eprintln!("ward-domain: {why}");
            ExitCode::from(3)
        }
    }
}

/// Arena ranges lent to one call: accessible until it returns.
type Lents = Vec<Lent>;

/// What the next request turned out to be.
enum Next {
    /// Nothing there yet.
    Empty,
    /// A call, ready to run, with the arena ranges lent to it.
    Call { id: u64, deferred: bool, callee: Callee, regs: RegArgs, lents: Lents },
    /// A call that cannot run (unknown function, bad arguments): answered with a status.
    Refused { id: u64, deferred: bool, status: Status },
    /// A batch of deferred calls, `len` bytes at the start of the buffer.
    Batch(usize),
    /// Any other record, `len` bytes at the start of the buffer.
    Other(usize),
    /// A call put aside until this process is back at the top level.
    Held,
}

/// Serve requests until the `CallbackReply` with id `until` arrives (None: forever).
fn serve_until(until: Option<u64>) -> Result<RegRet, String> {
    let mut record = [0u8; MAX_RECORD];
    loop {
        // One borrow of the serving state per record: take it off the ring and, for a call, prepare it.
        match with_server(|s| take(s, &mut record, until.is_none()))? {
            Next::Held => {}
            Next::Empty => {
                with_server(|s| {
                    if until.is_none() {
                        // No call in progress and nothing to do: the arena's protection changes for the next call
                        // happen now, while the host works, rather than after its request arrives.
                        settle_arena(s);
                    }
                    let spin = if s.hand_over { 0 } else { s.spin };
                    s.requests.wait(spin, None, &|| false)
                })
                .map_err(|e| format!("request ring: {e}"))?;
            }
            Next::Call { id, deferred, callee, regs, lents } => {
                // A plain load and store, not a swap: this process has one thread, and a locked instruction on every
                // call costs more than it protects.
                let outer = CURRENT_CALL.load(Ordering::Relaxed);
                CURRENT_CALL.store(id, Ordering::Relaxed);
                let ret = call(callee, &regs);
                CURRENT_CALL.store(outer, Ordering::Relaxed);
                if !lents.is_empty() {
                    with_server(|s| end_lents(s, lents));
                }
                if !deferred {
                    reply(id, Status::Ok, ret)?;
                }
            }
            Next::Refused { id, deferred, status } => {
                if !deferred {
                    reply(id, status, RegRet::default())?;
                }
            }
            Next::Batch(len) => run_batch(&record[..len])?,
            Next::Other(len) => {
                let message = Message::parse(&record[..len]).map_err(|e| format!("bad request from the host: {e}"))?;
                match message {
                    Message::Resolve { id, ext, name } => {
                        let found = with_server(|s| s.setup.library.resolve(ext, name));
                        match found {
                            Some(f) => reply(id, Status::Ok, RegRet { int: u64::from(f), float: 0 })?,
                            None => reply(id, Status::ResolveFailed, RegRet::default())?,
                        }
                    }
                    Message::Ping { id } => reply(id, Status::Ok, RegRet::default())?,
                    Message::Load { id, poison, path, init, reason } => {
                        let loaded = load(path, init, poison);
                        match loaded {
                            Ok(index) => reply(id, Status::Ok, RegRet { int: u64::from(index), float: 0 })?,
                            Err(why) => {
                                let written = with_server(|s| write_reason(s, reason, &why));
                                reply(id, Status::LoadFailed, RegRet { int: written as u64, float: 0 })?
                            }
                        }
                    }
                    Message::CallbackReply { id, ret_int, ret_float } => {
                        if until == Some(id) {
                            return Ok(RegRet { int: ret_int, float: ret_float });
                        }
                        return Err(format!("callback reply {id} while waiting for {until:?}"));
                    }
                    other => return Err(format!("unexpected request {other:?}")),
                }
            }
        }
    }
}

/// Load one more extension into this incarnation (its group gained a member while it ran).
fn load(path: &[u8], init: &[u8], poison: bool) -> Result<u32, String> {
    let path = std::str::from_utf8(path).map_err(|_| "the extension's path is not UTF-8".to_string())?;
    let init = std::str::from_utf8(init).map_err(|_| "the init function's name is not UTF-8".to_string())?;
    let ext = ExtensionArg { path: path.into(), init: (!init.is_empty()).then(|| init.to_string()), poison };
    // Text, as the rest of this file's errors: typed errors here changed the code around the extension's calls, and
    // with it the stale registers a mutated extension finds (see DECISIONS.md, "Errors outside the core are typed").
    with_server(|s| s.setup.library.load_one(&ext)).map_err(|e| e.to_string())
}

/// Write why a load failed into the output-pool buffer the host lent for it; returns the bytes written (none when
/// the buffer is not one of the pool's).
fn write_reason(s: &Server, (offset, len): (u64, u64), why: &str) -> usize {
    let rich = RichPtr { pool: ward_xpc::pool::POOL_OUT, offset, len };
    if s.setup.pool_out.resolve(&rich).is_err() {
        return 0;
    }
    let n = why.len().min(len as usize);
    match s.setup.pool_out.memory().write_at(offset as usize, &why.as_bytes()[..n]) {
        Ok(()) => n,
        Err(_) => 0,
    }
}

/// Run every call of a batch in order. No replies: these are deferred calls. A call that cannot run (an unknown
/// function, arguments that do not fit) is skipped, as its synchronous twin would have been refused.
fn run_batch(record: &[u8]) -> Result<(), String> {
    let batch = BatchView::parse(record).map_err(|e| format!("bad batch from the host: {e}"))?;
    // Every function a batch names was resolved before the batch was sent (the host closes a batch before any
    // other request), so one copy of the table serves the whole batch: no thread-local lookup and borrow of the
    // serving state per call, which cost as much as the call itself. The calls run outside any borrow, as they
    // may call back into the host. A batch lends no arena range, so one seal covers it (a nested call's lends
    // end with that call).
    let functions = with_server(|s| {
        seal_idle(s);
        s.setup.library.functions().to_vec()
    });
    let outer = CURRENT_CALL.load(Ordering::Relaxed);
    CURRENT_CALL.store(batch.id(), Ordering::Relaxed);
    for entry in batch.entries() {
        let Some(&callee) = functions.get(entry.func as usize) else {
            continue;
        };
        let mut packer = ArgPacker::new();
        if entry.args().all(|arg| push_scalar(&mut packer, &arg).is_ok()) {
            call(callee, &finish(packer, callee));
        }
    }
    CURRENT_CALL.store(outer, Ordering::Relaxed);
    Ok(())
}

/// Copy out the next request; for a call, resolve its function and translate its arguments. At the top level
/// held calls come first; inside a callback, a call not made from inside it is held (see `Server::held`).
fn take(s: &mut Server, record: &mut [u8; MAX_RECORD], top_level: bool) -> Result<Next, String> {
    let held = if top_level { s.held.pop_front() } else { None };
    let was_held = held.is_some();
    let len = match held {
        Some(held) => {
            record[..held.len()].copy_from_slice(&held);
            held.len()
        }
        None => match s.requests.pop(record).map_err(|e| format!("request ring: {e}"))? {
            Some(len) => len,
            None => return Ok(Next::Empty),
        },
    };
    let record = &record[..len];
    if !was_held {
        s.hand_over = ward_xpc::wire::is_hand_over(record);
    }
    let op = record.get(4).copied().map(Op::from);
    let is_call = matches!(op, Some(Op::Call | Op::Deferred | Op::Batch));
    if is_call && !top_level && !ward_xpc::wire::is_nested(record) {
        s.held.push_back(record.to_vec());
        return Ok(Next::Held);
    }
    match op {
        Some(Op::Call | Op::Deferred) => {}
        Some(Op::Batch) => return Ok(Next::Batch(len)),
        _ => return Ok(Next::Other(len)),
    }
    // Calls are the hot path: read them through a checked view instead of copying the argument list.
    let call = CallView::parse(record).map_err(|e| format!("bad call from the host: {e}"))?;
    let (id, deferred) = (call.id(), call.deferred());
    let mut lents = Lents::new();
    Ok(match prepare(s, call.func(), call.args(), record, Some(&mut lents)) {
        Ok((callee, regs)) => {
            seal_idle(s);
            Next::Call { id, deferred, callee, regs, lents }
        }
        Err(status) => {
            end_lents(s, lents);
            Next::Refused { id, deferred, status }
        }
    })
}

/// The call is over: its arena ranges become inaccessible again.
fn end_lents(s: &mut Server, lents: Lents) {
    if let Some(arena) = s.setup.arena.as_mut() {
        for lent in lents {
            arena.end(lent);
        }
    }
}

/// Run one call of the host's, poisoned if its extension's policy says so.
fn call(callee: Callee, regs: &RegArgs) -> RegRet {
    // SAFETY: the function was resolved with dlsym in an extension the host asked us to load; the host declared the
    // signature and `prepare` translated the arguments into this process' memory (only scalars in a batch). A wrong
    // declaration or a bug in the extension can crash this process, which is what the domain is for: the host
    // survives it.
    unsafe {
        if callee.poisoned {
            ward_abi::call_native_poisoned(callee.func, regs)
        } else {
            ward_abi::call_native(callee.func, regs)
        }
    }
}

fn reply(id: u64, status: Status, ret: RegRet) -> Result<(), String> {
    let mut buf = [0u8; REPLY_LEN];
    emit_reply(&mut buf, id, status, ret.int, ret.float);
    push(&buf)
}

fn send(message: &Message<'_>) -> Result<(), String> {
    let mut buf = [0u8; 256];
    let len = message.emit(&mut buf).map_err(|e| format!("cannot encode a record: {e}"))?;
    push(&buf[..len])
}

fn push(record: &[u8]) -> Result<(), String> {
    with_server(|s| {
        loop {
            match s.replies.push(record) {
                Ok(()) => break,
                // The host drains replies as it waits; a full reply ring only means it has not caught up.
                Err(ward_xpc::ring::RingError::Full) => {
                    s.replies.publish();
                    std::hint::spin_loop();
                }
                Err(e) => return Err(format!("reply ring: {e}")),
            }
        }
        s.replies.publish();
        Ok(())
    })
}

/// Translate a call's arguments to this process' addresses. Nothing the host sent is trusted to be in range.
/// Arena ranges are lent into `lents` (refused where `lents` is None: a batch carries scalars only); the caller ends
/// them, also when this fails.
fn prepare(
    s: &mut Server,
    func: u32,
    args: impl Iterator<Item = WireArg>,
    record: &[u8],
    mut lents: Option<&mut Lents>,
) -> Result<(Callee, RegArgs), Status> {
    let callee = s.setup.library.function(func).ok_or(Status::UnknownFunction)?;
    let mut packer = ArgPacker::new();
    for arg in args {
        let rich = RichPtr { pool: arg.pool, offset: arg.a, len: arg.b };
        let pushed = match arg.kind {
            ArgKind::BufIn | ArgKind::Str if arg.pool == POOL_ARENA => {
                packer.push_int(lend_arena(s, lents.as_deref_mut(), &arg, Access::Read)? as u64)
            }
            ArgKind::BufScratch if arg.pool == POOL_ARENA => {
                packer.push_int(lend_arena(s, lents.as_deref_mut(), &arg, Access::Scratch)? as u64)
            }
            ArgKind::BufOut | ArgKind::BufInOut if arg.pool == POOL_ARENA => {
                packer.push_int(lend_arena(s, lents.as_deref_mut(), &arg, Access::ReadWrite)? as u64)
            }
            ArgKind::Int | ArgKind::F64 | ArgKind::F32 | ArgKind::Callback => {
                push_scalar(&mut packer, &arg)?;
                Ok(())
            }
            ArgKind::BufIn | ArgKind::Str => {
                let p = s.setup.pool_in.resolve(&rich).map_err(|_| Status::BadArgs)?;
                packer.push_int(p as u64)
            }
            ArgKind::BufOut | ArgKind::BufInOut | ArgKind::BufScratch => {
                let p = s.setup.pool_out.resolve(&rich).map_err(|_| Status::BadArgs)?;
                packer.push_int(p as u64)
            }
            ArgKind::Inline => {
                let end = arg.a.checked_add(arg.b).ok_or(Status::BadArgs)?;
                if end > record.len() as u64 {
                    return Err(Status::BadArgs);
                }
                packer.push_int(record[arg.a as usize..].as_ptr() as u64)
            }
            ArgKind::Unknown(_) => return Err(Status::BadArgs),
        };
        pushed.map_err(|_| Status::BadArgs)?;
    }
    Ok((callee, finish(packer, callee)))
}

/// Pack one scalar argument (integer, float, callback); anything else is refused.
fn push_scalar(packer: &mut ArgPacker, arg: &WireArg) -> Result<(), Status> {
    let pushed = match arg.kind {
        ArgKind::Int => packer.push_int(arg.a),
        ArgKind::F64 => packer.push_f64(f64::from_bits(arg.a)),
        ArgKind::F32 => packer.push_f32(f32::from_bits(arg.a as u32)),
        ArgKind::Callback => {
            let stub = ward_abi::callback_stub(arg.a as usize).ok_or(Status::BadArgs)?;
            packer.push_int(stub as u64)
        }
        _ => return Err(Status::BadArgs),
    };
    pushed.map_err(|_| Status::BadArgs)
}

/// The register image of a packed call, poisoned if its extension's policy says so.
fn finish(packer: ArgPacker, callee: Callee) -> RegArgs {
    if callee.poisoned {
        packer.finish_poisoned()
    } else {
        packer.finish()
    }
}

/// Lend an arena range to the call being prepared; refused without an arena, or where `lents` is None.
fn lend_arena(s: &mut Server, lents: Option<&mut Lents>, arg: &WireArg, access: Access) -> Result<*mut u8, Status> {
    let (Some(arena), Some(lents)) = (s.setup.arena.as_mut(), lents) else {
        return Err(Status::BadArgs);
    };
    let at = BlockRef::from_wire(arg.a);
    let lent = arena.lend(at.block, at.offset, arg.b, access).map_err(|_| Status::BadArgs)?;
    let ptr = lent.ptr;
    lents.push(lent);
    Ok(ptr)
}

/// Between calls: see `ArenaView::settle`; a request arriving stops it.
fn settle_arena(s: &mut Server) {
    if let Some(arena) = s.setup.arena.as_mut() {
        let requests = &mut s.requests;
        arena.settle(|| !requests.is_empty().unwrap_or(true));
    }
}

/// Before prepared calls run: whatever they were not lent of the host's arena is out of the extension's reach.
fn seal_idle(s: &mut Server) {
    if let Some(arena) = s.setup.arena.as_mut() {
        arena.seal_idle();
    }
}

/// Where every callback stub lands: forward to the host, serve nested calls until the answer comes.
fn on_callback(slot: usize, args: &RegArgs) -> RegRet {
    let id = with_server(|s| {
        let id = s.next_callback_id;
        s.next_callback_id += 1;
        id
    });
    let message = Message::Callback { id, slot: slot as u32, ret: RetKind::Void, ints: args.ints, floats: args.floats };
    let result = send(&message).and_then(|()| serve_until(Some(id)));
    match result {
        Ok(ret) => ret,
        Err(why) => {
            // The host is broken or gone; an extension in the middle of a callback cannot be resumed sanely.
            eprintln!("ward-domain: {why}");
            std::process::exit(3);
        }
    }
}

fn with_server<R>(f: impl FnOnce(&mut Server) -> R) -> R {
    SERVER.with(|s| {
        let mut guard = s.borrow_mut();
        match guard.as_mut() {
            Some(server) => f(server),
            None => {
                eprintln!("ward-domain: serving state used before it was set up");
                std::process::exit(3);
            }
        }
    })
}
