//! Helpers shared by the unit tests.
#![allow(unsafe_code)]

// Returns rsp mod 16 as seen on entry: 8 if the caller aligned the stack before its `call`.
core::arch::global_asm!(
    ".pushsection .text.ward_abi_test_rsp_probe, \"ax\", @progbits",
    ".globl ward_abi_test_rsp_probe",
    ".hidden ward_abi_test_rsp_probe",
    ".type ward_abi_test_rsp_probe, @function",
    "ward_abi_test_rsp_probe:",
    "mov rax, rsp",
    "and eax, 15",
    "ret",
    ".size ward_abi_test_rsp_probe, . - ward_abi_test_rsp_probe",
    ".popsection",
);

extern "C" {
    /// Never called directly: only through `call_native` or from a dispatcher, as a function pointer.
    pub(crate) fn ward_abi_test_rsp_probe() -> u64;
}
