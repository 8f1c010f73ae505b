//! The arena blocks the live incarnation holds (`ward_xpc::arena`), and what it is told about them on its control
//! socket: a block's descriptor the first time a call lends the block (read-only for an input or scratch, read-write
//! for an output), and to drop blocks the host has freed since, or the least recently lent ones beyond its share of
//! descriptors. Nothing here makes a system call for a block the domain already holds as it is lent.

use std::collections::HashMap;
use std::os::fd::AsFd;

use ward_xpc::arena::{host, BlockMessage};
use ward_xpc::control::ControlSocket;

pub(crate) struct Lending {
    /// The incarnation's control socket.
    channel: ControlSocket,
    /// The blocks it holds.
    held: HashMap<u64, Held>,
    clock: u64,
    /// `host::retired()` when the held blocks were last checked for freed ones.
    retired_seen: u64,
    /// Blocks it may hold at once.
    cap: usize,
}

struct Held {
    writable: bool,
    last_lent: u64,
}

impl Lending {
    /// For an incarnation reached on `channel` whose descriptor limit is `open_files`: it may hold a quarter of
    /// them as blocks (the extension keeps the rest).
    pub fn new(channel: ControlSocket, open_files: u64) -> Lending {
        let cap = usize::try_from(open_files / 4).unwrap_or(usize::MAX).clamp(1, 256);
        Lending { channel, held: HashMap::new(), clock: 0, retired_seen: host::retired(), cap }
    }

    /// See that the domain holds `block`, writable if `writable`, before a call names it. `busy` says whether a
    /// block is lent to a call in flight (never dropped to make room). False when it cannot be given: the caller
    /// copies the buffer instead.
    pub fn ensure(&mut self, block: u64, writable: bool, busy: impl Fn(u64) -> bool) -> bool {
        self.clock += 1;
        self.drop_retired();
        let known = match self.held.get_mut(&block) {
            Some(h) if h.writable || !writable => {
                h.last_lent = self.clock;
                return true;
            }
            Some(_) => true,
            None => false,
        };
        if !known && !self.make_room(&busy) {
            return false;
        }
        let Some(fd) = host::descriptor(block, writable) else { return false };
        // Never waits: a domain that does not read its socket gets copies instead.
        if self.channel.offer(&BlockMessage::Lend { block, writable }.to_text(), Some(fd.as_fd())).is_err() {
            return false;
        }
        self.held.insert(block, Held { writable, last_lent: self.clock });
        true
    }

    /// Tell the domain to drop the blocks it holds that the host has freed (checked only when some lent block was).
    fn drop_retired(&mut self) {
        let now = host::retired();
        if now == self.retired_seen {
            return;
        }
        let freed: Vec<u64> = self.held.keys().copied().filter(|&b| !host::is_live(b)).collect();
        let mut told = true;
        for block in freed {
            told &= self.tell_drop(block);
        }
        if told {
            self.retired_seen = now;
        }
    }

    fn tell_drop(&mut self, block: u64) -> bool {
        let sent = self.channel.offer(&BlockMessage::Drop { block }.to_text(), None).is_ok();
        if sent {
            self.held.remove(&block);
        }
        sent
    }

    /// Below the cap, dropping the least recently lent blocks no call in flight uses.
    fn make_room(&mut self, busy: &impl Fn(u64) -> bool) -> bool {
        while self.held.len() >= self.cap {
            let victim = self.held.iter().filter(|(b, _)| !busy(**b)).min_by_key(|(_, h)| h.last_lent).map(|(b, _)| *b);
            match victim {
                Some(block) if self.tell_drop(block) => {}
                _ => return false,
            }
        }
        true
    }
}
