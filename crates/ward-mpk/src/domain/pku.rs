//! Memory protection keys: whether this machine has them, allocating keys, tagging pages, and the PKRU register.
//!
//! PKRU holds two bits per key: AD (access disable) at bit `2k` and WD (write disable) at bit `2k + 1`. They apply
//! to data accesses to user pages, from user mode and from the kernel on the thread's behalf (`copy_to_user`),
//! never to instruction fetches. A new mapping gets key 0, the key every page of the host has.

use std::arch::asm;
use std::io;

/// `si_code` of a SIGSEGV raised by a protection-key check (`asm-generic/siginfo.h`); libc does not name it.
pub const SEGV_PKUERR: i32 = 4;

/// The key every page starts with: the host's.
pub const HOST_KEY: u32 = 0;

/// Whether this processor has protection keys and the kernel has enabled them: CPUID leaf 7's OSPKE bit, which the
/// processor sets only once the kernel has turned PKU on (CR4.PKE). pkey_alloc's refusal cannot tell: a kernel
/// without PKU support in use answers EINVAL or ENOSPC.
///
/// Asked once per process: CPUID traps to the hypervisor in a virtual machine (microseconds each), and a host under
/// `ward run` asks for every library it opens.
pub fn available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        const OSPKE: u32 = 1 << 4;
        if std::arch::x86_64::__cpuid(0).eax < 7 {
            return false;
        }
        let leaf7 = std::arch::x86_64::__cpuid_count(7, 0);
        leaf7.ecx & OSPKE != 0
    })
}

/// One protection key of this process, freed on drop. Pages still tagged with it keep the tag; the kernel may hand
/// the key out again, so free a key only after unmapping (or retagging) its pages.
#[derive(Debug)]
pub struct ProtectionKey(u32);

impl ProtectionKey {
    /// A fresh key, with all access allowed on this thread (other threads keep their PKRU).
    pub fn allocate() -> io::Result<ProtectionKey> {
        // SAFETY: pkey_alloc(flags = 0, access_rights = 0) only reserves a key number; it touches no memory.
        let key = unsafe { libc::syscall(libc::SYS_pkey_alloc, 0u64, 0u64) };
        if key < 0 {
            return Err(io::Error::last_os_error());
        }
        // The kernel's keys are 1..=15 on x86-64.
        u32::try_from(key).map(ProtectionKey).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
    }

    pub fn number(&self) -> u32 {
        self.0
    }
}

impl Drop for ProtectionKey {
    fn drop(&mut self) {
        // SAFETY: the key was allocated by this object and is freed once; pkey_free touches no memory.
        unsafe { libc::syscall(libc::SYS_pkey_free, u64::from(self.0)) };
    }
}

/// A PKRU value: which keys a thread may read and write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pkru(pub u32);

impl Pkru {
    /// Every key denied (reads and writes).
    pub const DENY_ALL: Pkru = Pkru(0x5555_5555);

    /// This value with `key` readable and writable.
    pub const fn allow(self, key: u32) -> Pkru {
        Pkru(self.0 & !(0b11 << (2 * key)))
    }

    /// This value with `key` readable only.
    pub const fn read_only(self, key: u32) -> Pkru {
        Pkru((self.0 & !(0b11 << (2 * key))) | (0b10 << (2 * key)))
    }

    /// This value with every key `other` lets be written allowed as well (bit by bit, no loop over keys: it is on
    /// the gate's path).
    pub const fn allowing_writes_of(self, other: Pkru) -> Pkru {
        // Bit 2k of `restricted` is set when key k is restricted in `other` (AD or WD).
        let restricted = other.0 | (other.0 >> 1);
        let writable = !restricted & 0x5555_5555;
        Pkru(self.0 & !(writable | (writable << 1)))
    }

    /// Whether `key` may be written.
    pub const fn writes(self, key: u32) -> bool {
        self.0 & (0b11 << (2 * key)) == 0
    }

    /// Whether `key` may be read.
    #[cfg(test)]
    pub const fn reads(self, key: u32) -> bool {
        self.0 & (0b01 << (2 * key)) == 0
    }

    /// This thread's PKRU. Only on a machine where [`available`] is true (RDPKRU is an invalid instruction
    /// elsewhere).
    pub fn current() -> Pkru {
        let value: u32;
        // SAFETY: RDPKRU (ecx = 0) reads PKRU into eax and zeroes edx; it touches no memory. The caller runs only
        // where PKU is enabled, so it does not fault.
        unsafe { asm!("rdpkru", in("ecx") 0u32, out("eax") value, out("edx") _, options(nostack, preserves_flags)) };
        Pkru(value)
    }
}

/// Tag `len` bytes of pages at `addr` with `key` and give them `prot`.
///
/// # Safety
/// `[addr, addr + len)` must be page-aligned memory this caller owns the mapping of: a change of protection there
/// must not break anyone else's assumptions.
pub unsafe fn protect_with_key(addr: *mut u8, len: usize, prot: i32, key: u32) -> io::Result<()> {
    // SAFETY: the caller owns the range (see above); pkey_mprotect changes protections and the key, nothing else.
    let r = unsafe { libc::syscall(libc::SYS_pkey_mprotect, addr as usize, len, prot as u64, u64::from(key)) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pkru_bits_follow_the_architecture() {
        assert_eq!(Pkru::DENY_ALL.allow(0).0, 0x5555_5554);
        assert_eq!(Pkru::DENY_ALL.allow(0).read_only(0).0, 0x5555_5556);
        let p = Pkru::DENY_ALL.allow(3).read_only(0);
        assert!(p.writes(3) && p.reads(3));
        assert!(!p.writes(0) && p.reads(0));
        assert!(!p.writes(2) && !p.reads(2));
    }

    #[test]
    fn widening_to_another_values_writable_keys_leaves_the_rest_alone() {
        let host = Pkru::DENY_ALL.allow(0).read_only(5);
        let domain = Pkru::DENY_ALL.read_only(0).allow(3).allow(5);
        let widened = host.allowing_writes_of(domain);
        assert_eq!(widened, host.allow(3).allow(5));
        assert_eq!(widened.allowing_writes_of(domain), widened);
    }
}
