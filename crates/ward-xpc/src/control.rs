//! The control socket between a host and a domain process: short messages on a `SOCK_SEQPACKET` socket pair, each
//! optionally carrying one descriptor (`SCM_RIGHTS`). The rings carry calls; this carries the few things that are
//! not calls: readiness, load errors, fork and load requests to a zygote and the pidfds, exit statuses and answers
//! that come back.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// Largest control message either side sends: room for a `load` request naming a path as long as Linux allows.
pub const MAX_CONTROL_MESSAGE: usize = 8192;

/// Cut `text` to at most [`MAX_CONTROL_MESSAGE`] bytes, at a character boundary.
pub fn fit(text: &mut String) {
    if text.len() > MAX_CONTROL_MESSAGE {
        let mut end = MAX_CONTROL_MESSAGE;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
}

/// A zygote's `load` request: one more extension to load (and initialise) before its next fork, because a group
/// gained a member. As text: `load`, the poison flag (`0` or `1`), the init function (empty for none) and the path,
/// one per line; the path comes last so it may hold any character. The zygote answers `loaded INDEX` or
/// `error REASON`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadRequest<'a> {
    pub path: &'a str,
    pub init: Option<&'a str>,
    pub poison: bool,
}

impl<'a> LoadRequest<'a> {
    /// The request as a control message; None when it cannot be one (an init name with a line break, or too long).
    pub fn to_text(&self) -> Option<String> {
        let init = self.init.unwrap_or("");
        if init.contains('\n') {
            return None;
        }
        let text = format!("load\n{}\n{init}\n{}", u8::from(self.poison), self.path);
        (text.len() <= MAX_CONTROL_MESSAGE).then_some(text)
    }

    /// Parse a control message; None when it is not a well-formed `load` request.
    pub fn parse(text: &'a str) -> Option<LoadRequest<'a>> {
        let mut parts = text.splitn(4, '\n');
        if parts.next()? != "load" {
            return None;
        }
        let poison = match parts.next()? {
            "0" => false,
            "1" => true,
            _ => return None,
        };
        let init = parts.next()?;
        let path = parts.next()?;
        if path.is_empty() {
            return None;
        }
        Some(LoadRequest { path, init: (!init.is_empty()).then_some(init), poison })
    }
}

#[derive(Debug)]
pub struct ControlSocket {
    fd: OwnedFd,
}

/// One received message.
#[derive(Debug)]
pub struct ControlMessage {
    pub text: String,
    pub fd: Option<OwnedFd>,
}

impl ControlSocket {
    /// A connected pair, both ends close-on-exec.
    pub fn pair() -> io::Result<(ControlSocket, ControlSocket)> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: fds is a valid array of two ints for socketpair to fill.
        let rc =
            unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: socketpair succeeded, so both descriptors are open and owned by nobody else.
        let (a, b) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        Ok((ControlSocket { fd: a }, ControlSocket { fd: b }))
    }

    pub fn from_fd(fd: OwnedFd) -> ControlSocket {
        ControlSocket { fd }
    }

    /// Send one message, optionally with a descriptor.
    pub fn send(&self, text: &str, fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
        self.send_with(text, fd, 0)
    }

    /// Send one message without waiting: a peer that does not read its messages makes this fail (`WouldBlock`)
    /// instead of blocking the sender.
    pub fn offer(&self, text: &str, fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
        self.send_with(text, fd, libc::MSG_DONTWAIT)
    }

    fn send_with(&self, text: &str, fd: Option<BorrowedFd<'_>>, flags: libc::c_int) -> io::Result<()> {
        let bytes = text.as_bytes();
        if bytes.len() > MAX_CONTROL_MESSAGE {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "control message too long"));
        }
        let mut iov = libc::iovec { iov_base: bytes.as_ptr() as *mut libc::c_void, iov_len: bytes.len() };
        // Aligned room for one control message holding one int.
        let mut cmsg_buf = [0u64; 8];
        // SAFETY: msghdr is plain data; all-zero is a valid empty header.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if let Some(fd) = fd {
            // SAFETY: CMSG_SPACE is a pure size computation.
            let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
            msg.msg_control = cmsg_buf.as_mut_ptr().cast();
            msg.msg_controllen = space;
            // SAFETY: msg_control points at cmsg_buf (64 bytes, more than `space`), so CMSG_FIRSTHDR is non-null and
            // the header plus one int of data lie inside cmsg_buf.
            unsafe {
                let cmsg = libc::CMSG_FIRSTHDR(&msg);
                (*cmsg).cmsg_level = libc::SOL_SOCKET;
                (*cmsg).cmsg_type = libc::SCM_RIGHTS;
                (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize;
                std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd.as_raw_fd());
            }
        }
        loop {
            // SAFETY: msg points at iov and cmsg_buf, both alive for this call.
            let n = unsafe { libc::sendmsg(self.fd.as_raw_fd(), &msg, libc::MSG_NOSIGNAL | flags) };
            if n >= 0 {
                return Ok(());
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(err);
            }
        }
    }

    /// Receive one message. `Ok(None)` when the peer closed its end or `timeout` passed first
    /// (`timeout` None: wait forever).
    pub fn recv(&self, timeout: Option<Duration>) -> io::Result<Option<ControlMessage>> {
        if let Some(t) = timeout {
            if !self.readable(t)? {
                return Ok(None);
            }
        }
        self.recv_with(0)
    }

    /// Receive one message if one is there: `Ok(None)` when none is (or the peer closed its end).
    pub fn try_recv(&self) -> io::Result<Option<ControlMessage>> {
        match self.recv_with(libc::MSG_DONTWAIT) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            other => other,
        }
    }

    fn recv_with(&self, flags: libc::c_int) -> io::Result<Option<ControlMessage>> {
        let mut buf = [0u8; MAX_CONTROL_MESSAGE];
        let mut cmsg_buf = [0u64; 8];
        let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
        // SAFETY: plain data, zeroed is valid.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cmsg_buf.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&cmsg_buf);
        let n = loop {
            // SAFETY: msg points at buf and cmsg_buf, both writable and alive for this call.
            let n = unsafe { libc::recvmsg(self.fd.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC | flags) };
            if n >= 0 {
                break n as usize;
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(err);
            }
        };
        let mut fd = None;
        // SAFETY: the kernel filled msg_control/msg_controllen; CMSG_FIRSTHDR/NXTHDR stay within that buffer.
        unsafe {
            let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
            while !cmsg.is_null() {
                if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                    let raw = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>());
                    // The kernel installed this descriptor in our table for us; we own it now. Keep the first,
                    // close any extra a misbehaving peer sent.
                    let owned = OwnedFd::from_raw_fd(raw);
                    if fd.is_none() {
                        fd = Some(owned);
                    }
                }
                cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
            }
        }
        if n == 0 && fd.is_none() {
            return Ok(None);
        }
        Ok(Some(ControlMessage { text: String::from_utf8_lossy(&buf[..n]).into_owned(), fd }))
    }

    fn readable(&self, timeout: Duration) -> io::Result<bool> {
        let mut pfd = libc::pollfd { fd: self.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        loop {
            // SAFETY: pfd is one valid pollfd.
            let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
            if rc >= 0 {
                return Ok(rc > 0);
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(err);
            }
        }
    }
}

impl AsFd for ControlSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_text_and_a_descriptor() {
        let (a, b) = ControlSocket::pair().unwrap();
        let (x, _y) = ControlSocket::pair().unwrap();
        a.send("forked 42", Some(x.as_fd())).unwrap();
        let m = b.recv(Some(Duration::from_secs(5))).unwrap().unwrap();
        assert_eq!(m.text, "forked 42");
        let got = m.fd.expect("a descriptor came along");
        assert_ne!(got.as_raw_fd(), x.as_fd().as_raw_fd());
    }

    #[test]
    fn offers_and_tries_without_waiting() {
        let (a, b) = ControlSocket::pair().unwrap();
        assert!(b.try_recv().unwrap().is_none(), "nothing there yet");
        let mut sent = 0;
        loop {
            match a.offer("x", None) {
                Ok(()) => sent += 1,
                Err(e) => {
                    assert_eq!(e.kind(), io::ErrorKind::WouldBlock, "{e}");
                    break;
                }
            }
            assert!(sent < 1_000_000, "the socket never filled");
        }
        assert_eq!(b.try_recv().unwrap().unwrap().text, "x");
        drop(a);
        for _ in 1..sent {
            assert!(b.try_recv().unwrap().is_some());
        }
        assert!(b.try_recv().unwrap().is_none(), "the peer closed");
    }

    #[test]
    fn times_out_and_sees_the_peer_close() {
        let (a, b) = ControlSocket::pair().unwrap();
        assert!(b.recv(Some(Duration::from_millis(1))).unwrap().is_none());
        drop(a);
        assert!(b.recv(Some(Duration::from_secs(5))).unwrap().is_none());
    }

    #[test]
    fn a_message_as_long_as_allowed_passes_and_a_longer_one_is_refused() {
        let (a, b) = ControlSocket::pair().unwrap();
        let long = "x".repeat(MAX_CONTROL_MESSAGE);
        a.send(&long, None).unwrap();
        assert_eq!(b.recv(Some(Duration::from_secs(5))).unwrap().unwrap().text, long);
        assert!(a.send(&format!("{long}y"), None).is_err());
    }

    #[test]
    fn fit_cuts_at_a_character_boundary() {
        // Two-byte characters, so the limit falls inside one when the text starts one byte off.
        let mut text = format!("a{}", "é".repeat(MAX_CONTROL_MESSAGE));
        fit(&mut text);
        assert_eq!(text.len(), MAX_CONTROL_MESSAGE - 1);
        let mut short = "short".to_string();
        fit(&mut short);
        assert_eq!(short, "short");
    }

    #[test]
    fn load_requests_round_trip_and_odd_ones_are_refused() {
        for r in [
            LoadRequest { path: "/usr/lib/ladspa/amp.so", init: None, poison: false },
            LoadRequest { path: "/tmp/a dir/with\nnewline.so", init: Some("ext_init"), poison: true },
        ] {
            let text = r.to_text().unwrap();
            assert_eq!(LoadRequest::parse(&text), Some(r));
        }
        assert_eq!(LoadRequest { path: "x.so", init: Some("a\nb"), poison: false }.to_text(), None);
        let long = "p".repeat(MAX_CONTROL_MESSAGE);
        assert_eq!(LoadRequest { path: &long, init: None, poison: false }.to_text(), None);
        for bad in ["fork", "load\n2\n\nx.so", "load\n0\n\n", "load\n0", "loaded 1"] {
            assert_eq!(LoadRequest::parse(bad), None, "{bad:?}");
        }
    }
}
