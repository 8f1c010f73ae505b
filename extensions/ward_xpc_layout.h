/*
 * Layout of the shared region between a host and a ward-domain process.
 *
 * The Rust side (crates/ward-xpc/src/layout.rs) is the implementation; this
 * header mirrors its constants for C test extensions that attack the protocol
 * on purpose (forged and garbage replies). A test in ward-xpc checks that the
 * two agree.
 *
 * Region (one memfd named WARD_XPC_MEMFD_NAME), all offsets in bytes:
 *   page 0   header: magic, version, ring capacity, fault record
 *   page 1   request ring control  (host -> domain)
 *   page 2   reply ring control    (domain -> host)
 *   page 3.. request ring data     (capacity bytes; read-only in the domain)
 *   then     reply ring data       (capacity bytes)
 *
 * Ring positions (head, tail) are byte counts that only grow; the offset of a
 * position in the data area is pos & (capacity - 1). Records are 16-byte
 * aligned and never straddle the end of the data area (a PAD record fills the
 * rest instead). A record is ready when the u32 length at its start is
 * non-zero: the producer writes the body, zeroes the length of the slot after
 * it, and stores the record's length last; the tail is a wake-up hint.
 */
#ifndef WARD_XPC_LAYOUT_H
#define WARD_XPC_LAYOUT_H

#define WARD_XPC_MEMFD_NAME "ward-xpc"
#define WARD_XPC_PAGE 4096u

#define WARD_XPC_MAGIC 0x3143505844524157ull /* "WARDXPC1" little-endian */
#define WARD_XPC_VERSION 1u

/* header page */
#define WARD_XPC_HDR_MAGIC 0u         /* u64 */
#define WARD_XPC_HDR_VERSION 8u       /* u32 */
#define WARD_XPC_HDR_RING_CAPACITY 12u /* u32, power of two, multiple of the page */

#define WARD_XPC_REQ_CTRL_OFF 4096u
#define WARD_XPC_REP_CTRL_OFF 8192u
#define WARD_XPC_REQ_DATA_OFF 12288u
/* reply data offset = WARD_XPC_REQ_DATA_OFF + ring capacity */

/* ring control page */
#define WARD_XPC_CTRL_TAIL 0u      /* u64, written by the producer */
#define WARD_XPC_CTRL_HEAD 128u    /* u64, written by the consumer */
#define WARD_XPC_CTRL_WAITING 256u /* u32, consumer sets it before sleeping */
#define WARD_XPC_CTRL_DOORBELL 260u /* u32, futex word the producer bumps */

/* record header: 16 bytes */
#define WARD_XPC_REC_LEN 0u    /* u32 total length, multiple of 16 */
#define WARD_XPC_REC_OP 4u     /* u8 */
#define WARD_XPC_REC_NARGS 5u  /* u8 */
#define WARD_XPC_REC_RET 6u    /* u8 */
#define WARD_XPC_REC_FLAGS 7u  /* u8 */
#define WARD_XPC_REC_ID 8u     /* u64 */
#define WARD_XPC_REC_HEADER_LEN 16u

#define WARD_XPC_OP_REPLY 3u
/* reply body */
#define WARD_XPC_REPLY_STATUS 16u    /* u32 */
#define WARD_XPC_REPLY_RET_INT 24u   /* u64 */
#define WARD_XPC_REPLY_RET_FLOAT 32u /* u64 */
#define WARD_XPC_REPLY_LEN 48u

#endif
