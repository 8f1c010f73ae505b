//! Checking an atom a plugin wrote to an output port before the host sees it: a sequence whose sizes run past its
//! buffer, an event without a type, or events out of time order would make the host read past the buffer or
//! misbehave, so a malformed one is the plugin's fault (`BadOutput`), never handed on.

/// Bytes of an atom header (size, type) and of a sequence body's header (unit, pad), and of an event's header (time,
/// then its atom's size and type).
pub const ATOM_HEADER: usize = 8;
const SEQUENCE_BODY_HEADER: usize = 8;
const EVENT_HEADER: usize = 16;

/// The URIDs a check needs, from the host's map.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AtomUrids {
    pub sequence: u32,
    pub frame_time: u32,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Check the atom in `buffer` (header and body) a plugin wrote, given its `capacity` (the buffer's bytes after the
/// header) and the block's `samples`. The bytes of the atom to hand to the host (header included), or what is wrong.
/// An atom that is not a sequence is handed on as it is, within its capacity.
pub fn check_output(buffer: &[u8], capacity: usize, samples: usize, urids: AtomUrids) -> Result<usize, String> {
    if buffer.len() < ATOM_HEADER || capacity > buffer.len() - ATOM_HEADER {
        return Err(format!("an atom output of {} bytes cannot hold its header and {capacity}", buffer.len()));
    }
    let size = u32_at(buffer, 0) as usize;
    let kind = u32_at(buffer, 4);
    if size > capacity {
        return Err(format!("an atom output claims {size} bytes, past its capacity of {capacity}"));
    }
    let total = ATOM_HEADER + size;
    if urids.sequence == 0 || kind != urids.sequence {
        return Ok(total);
    }
    if size < SEQUENCE_BODY_HEADER {
        return Err(format!("a sequence of {size} bytes, shorter than its own header"));
    }
    let unit = u32_at(buffer, ATOM_HEADER);
    let frames = unit == 0 || unit == urids.frame_time;
    let mut at = ATOM_HEADER + SEQUENCE_BODY_HEADER;
    let mut last: Option<i64> = None;
    let mut event = 0usize;
    while at < total {
        if total - at < EVENT_HEADER {
            return Err(format!("event {event} of a sequence starts {} bytes before its end", total - at));
        }
        let time = i64::from_le_bytes(buffer[at..at + 8].try_into().unwrap_or([0; 8]));
        let body = u32_at(buffer, at + 8) as usize;
        let body_type = u32_at(buffer, at + 12);
        let end = (at + EVENT_HEADER).checked_add(body).filter(|&e| e <= total);
        let Some(end) = end else {
            return Err(format!("event {event} of a sequence claims {body} bytes, past the sequence's end"));
        };
        if body_type == 0 {
            return Err(format!("event {event} of a sequence has no type"));
        }
        if frames {
            if time < 0 || time as u64 > samples as u64 {
                return Err(format!("event {event} of a sequence is at frame {time}, outside a block of {samples}"));
            }
            if last.is_some_and(|l| time < l) {
                return Err(format!("event {event} of a sequence is at frame {time}, before the event ahead of it"));
            }
            last = Some(time);
        }
        // Events are padded to 8 bytes; the last one's padding may lie past the sequence's size.
        at = (end + 7) & !7;
        event += 1;
    }
    Ok(total)
}

/// An empty sequence (what a bypassed plugin's atom outputs hold): its header and body header.
pub fn empty_sequence(urids: AtomUrids) -> [u8; ATOM_HEADER + SEQUENCE_BODY_HEADER] {
    let mut b = [0u8; ATOM_HEADER + SEQUENCE_BODY_HEADER];
    b[0..4].copy_from_slice(&(SEQUENCE_BODY_HEADER as u32).to_le_bytes());
    b[4..8].copy_from_slice(&urids.sequence.to_le_bytes());
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    const URIDS: AtomUrids = AtomUrids { sequence: 7, frame_time: 9 };

    fn sequence(events: &[(i64, u32, &[u8])], capacity: usize) -> Vec<u8> {
        let mut body = vec![0u8; 8];
        for (time, kind, data) in events {
            body.extend_from_slice(&time.to_le_bytes());
            body.extend_from_slice(&(data.len() as u32).to_le_bytes());
            body.extend_from_slice(&kind.to_le_bytes());
            body.extend_from_slice(data);
            while !body.len().is_multiple_of(8) {
                body.push(0);
            }
        }
        let mut b = (body.len() as u32).to_le_bytes().to_vec();
        b.extend_from_slice(&URIDS.sequence.to_le_bytes());
        b.extend_from_slice(&body);
        b.resize(ATOM_HEADER + capacity, 0xAA);
        b
    }

    #[test]
    fn a_well_formed_sequence_passes_with_its_size() {
        let b = sequence(&[(0, 3, &[1, 2, 3]), (5, 3, &[4]), (5, 4, &[])], 256);
        let size = u32_at(&b, 0) as usize;
        assert_eq!(check_output(&b, 256, 64, URIDS), Ok(ATOM_HEADER + size));
    }

    #[test]
    fn a_sequence_claiming_more_than_its_capacity_is_refused() {
        let mut b = sequence(&[(0, 3, &[1])], 64);
        b[0..4].copy_from_slice(&100u32.to_le_bytes());
        assert!(check_output(&b, 64, 64, URIDS).unwrap_err().contains("past its capacity"));
    }

    #[test]
    fn an_event_running_past_the_sequence_is_refused() {
        let mut b = sequence(&[(0, 3, &[1, 2, 3, 4])], 64);
        // The event's size now runs past the sequence's end.
        b[ATOM_HEADER + 8 + 8..ATOM_HEADER + 8 + 12].copy_from_slice(&60u32.to_le_bytes());
        assert!(check_output(&b, 64, 64, URIDS).unwrap_err().contains("past the sequence's end"));
    }

    #[test]
    fn events_out_of_order_or_outside_the_block_or_untyped_are_refused() {
        let b = sequence(&[(5, 3, &[1]), (2, 3, &[1])], 128);
        assert!(check_output(&b, 128, 64, URIDS).unwrap_err().contains("before the event ahead"));
        let b = sequence(&[(65, 3, &[1])], 128);
        assert!(check_output(&b, 128, 64, URIDS).unwrap_err().contains("outside a block"));
        let b = sequence(&[(0, 0, &[1])], 128);
        assert!(check_output(&b, 128, 64, URIDS).unwrap_err().contains("no type"));
    }

    #[test]
    fn an_atom_that_is_no_sequence_is_handed_on_within_its_capacity() {
        let mut b = vec![0u8; ATOM_HEADER + 32];
        b[0..4].copy_from_slice(&32u32.to_le_bytes());
        b[4..8].copy_from_slice(&99u32.to_le_bytes());
        assert_eq!(check_output(&b, 32, 64, URIDS), Ok(40));
    }

    #[test]
    fn the_empty_sequence_checks() {
        let mut b = empty_sequence(URIDS).to_vec();
        b.resize(64, 0);
        assert_eq!(check_output(&b, 56, 64, URIDS), Ok(16));
    }
}
