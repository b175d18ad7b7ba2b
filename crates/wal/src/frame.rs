//! Frames: how a record sits in a segment.
//!
//! ```text
//!   offset 0 (8-aligned)
//!   ┌────────────┬──────────┬────────────┬──────────┬──────────────────┬──────────┐
//!   │ magic u32  │ len u32  │ crc32c u32 │ hcheck u32 │ payload (len)  │ 0 pad →8 │
//!   └────────────┴──────────┴────────────┴────────────┴────────────────┴──────────┘
//!   all little-endian; crc32c (Castagnoli) over len's 4 bytes then the payload; hcheck:
//!   crc32c over magic's and len's 8 bytes
//! ```
//!
//! A segment is zero-filled before it is used, so the first all-zero header marks the end of
//! what was written. A frame whose header sits in one sector is never half a header (a sector is
//! written whole), so a torn write shows as a missing tail or zeroed sectors inside the payload.
//! The header carries a check of its own (format 2; format 1 wrote zero there): without it, a
//! flipped bit that lengthens the last frame's `len` made the frame reach into the zero-filled
//! rest of the segment and pass for a torn write, and the log cleared an entry it had synced
//! (found by the simulator).

pub(crate) const MAGIC: u32 = 0x4157_484C; // "LHWA" little-endian
pub(crate) const HEADER_BYTES: usize = 16;
pub(crate) const ALIGN_BYTES: usize = 8;
/// No frame is larger: a length past it is damage, not a record.
pub const FRAME_PAYLOAD_BYTES_MAX: usize = 256 * 1024 * 1024;

/// CRC-32C (Castagnoli) over the length's bytes and the payload, with the CPU's CRC32
/// instruction where it has one.
fn checksum(len: u32, payload: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&len.to_le_bytes()), payload)
}

/// The header's own check: CRC32C over the magic's and the length's bytes.
fn header_check(len: u32) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&MAGIC.to_le_bytes()), &len.to_le_bytes())
}

/// Which header checks a segment's frames carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Headers {
    /// Format 2: every header carries its check.
    Checked,
    /// Format 1 wrote zero in the check's place; a segment's first frame is read this way too,
    /// before its format is known (a checked header passes as well).
    CheckedOrZero,
}

/// The bytes a frame of `payload_len` takes, padding included.
pub(crate) fn framed_len(payload_len: usize) -> usize {
    (HEADER_BYTES + payload_len).next_multiple_of(ALIGN_BYTES)
}

/// Appends one frame holding `payload` to `out`.
pub(crate) fn encode(payload: &[u8], out: &mut Vec<u8>) {
    assert!(payload.len() <= FRAME_PAYLOAD_BYTES_MAX, "frame too large");
    let len = u32::try_from(payload.len()).expect("bounded by FRAME_PAYLOAD_BYTES_MAX");
    let start = out.len();
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&checksum(len, payload).to_le_bytes());
    out.extend_from_slice(&header_check(len).to_le_bytes());
    out.extend_from_slice(payload);
    out.resize(start + framed_len(payload.len()), 0);
}

/// What is at one offset of a segment.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Read<'a> {
    /// An intact frame, and the offset just past it.
    Frame { payload: &'a [u8], next: usize },
    /// An all-zero header: nothing was written here.
    End,
    /// Not an intact frame: a torn write or damage (see [`classify`]).
    Bad(BadFrame),
}

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub(crate) enum BadFrame {
    /// The header is not one this log writes (wrong magic, a header check that fails, a length
    /// past the limit): a header is written whole, so this is damage, never a torn write.
    Header,
    /// The frame runs past the end of the file.
    Short,
    /// The checksum does not match, and a sector of the frame reads as zeros: a write that did
    /// not reach the disk whole.
    Torn,
    /// The checksum does not match though every sector of the frame was written: the bytes
    /// changed after they were written.
    Checksum,
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

/// Reads the frame at `at` (8-aligned) of `segment`.
pub(crate) fn read(segment: &[u8], at: usize, headers: Headers) -> Read<'_> {
    debug_assert_eq!(at % ALIGN_BYTES, 0);
    if at + HEADER_BYTES > segment.len() {
        return if segment[at.min(segment.len())..].iter().all(|b| *b == 0) {
            Read::End
        } else {
            Read::Bad(BadFrame::Short)
        };
    }
    let header = &segment[at..at + HEADER_BYTES];
    if header.iter().all(|b| *b == 0) {
        return Read::End;
    }
    let len = u32_at(header, 4);
    let len_usize = usize::try_from(len).unwrap_or(usize::MAX);
    let check = u32_at(header, 12);
    let checked = check == header_check(len) || (headers == Headers::CheckedOrZero && check == 0);
    if u32_at(header, 0) != MAGIC || !checked || len_usize > FRAME_PAYLOAD_BYTES_MAX {
        return Read::Bad(BadFrame::Header);
    }
    let end = at + HEADER_BYTES + len_usize;
    if end > segment.len() {
        return Read::Bad(BadFrame::Short);
    }
    let payload = &segment[at + HEADER_BYTES..end];
    if checksum(len, payload) != u32_at(header, 8) {
        return Read::Bad(classify(segment, at, end));
    }
    Read::Frame {
        payload,
        next: at + framed_len(len_usize),
    }
}

/// A frame in `[start, end)` failed its checksum: torn if some sector's share of it is all
/// zeros (the preallocated zeros a write never replaced), else damage.
fn classify(segment: &[u8], start: usize, end: usize) -> BadFrame {
    let sector = crate::fs::SECTOR_BYTES;
    let mut from = start;
    while from < end {
        let to = (from / sector + 1) * sector;
        let to = to.min(end);
        if segment[from..to].iter().all(|b| *b == 0) {
            return BadFrame::Torn;
        }
        from = to;
    }
    BadFrame::Checksum
}

/// Whether an intact frame starts at any 8-aligned offset at or after `from`: after a bad frame,
/// one means the damage is inside the log, not at its tail.
pub(crate) fn intact_frame_after(segment: &[u8], from: usize) -> Option<usize> {
    let mut at = from.next_multiple_of(ALIGN_BYTES);
    while at + HEADER_BYTES <= segment.len() {
        if u32_at(segment, at) == MAGIC
            && matches!(
                read(segment, at, Headers::CheckedOrZero),
                Read::Frame { .. }
            )
        {
            return Some(at);
        }
        at += ALIGN_BYTES;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        encode(payload, &mut out);
        out
    }

    #[test]
    fn a_frame_reads_back_and_pads_to_eight() {
        let mut seg = framed(b"hello");
        assert_eq!(seg.len(), 24);
        seg.resize(64, 0);
        assert_eq!(
            read(&seg, 0, Headers::Checked),
            Read::Frame {
                payload: b"hello",
                next: 24
            }
        );
        assert_eq!(read(&seg, 24, Headers::Checked), Read::End);
        assert_eq!(read(&seg, 64, Headers::Checked), Read::End);
    }

    #[test]
    fn a_flipped_bit_in_a_written_frame_is_damage_not_a_torn_write() {
        let mut seg = framed(&[7u8; 100]);
        seg[40] ^= 0x10;
        assert_eq!(
            read(&seg, 0, Headers::Checked),
            Read::Bad(BadFrame::Checksum)
        );
    }

    #[test]
    fn a_frame_whose_later_sector_never_arrived_is_torn() {
        let mut seg = framed(&[9u8; 2000]);
        for b in &mut seg[1024..1536] {
            *b = 0;
        }
        assert_eq!(read(&seg, 0, Headers::Checked), Read::Bad(BadFrame::Torn));
    }

    #[test]
    fn a_frame_cut_short_by_the_end_of_the_file_is_short() {
        let seg = framed(&[1u8; 100]);
        assert_eq!(
            read(&seg[..60], 0, Headers::Checked),
            Read::Bad(BadFrame::Short)
        );
    }

    #[test]
    fn a_header_this_log_never_writes_is_refused() {
        let mut seg = framed(b"abc");
        seg[0] ^= 1;
        assert_eq!(read(&seg, 0, Headers::Checked), Read::Bad(BadFrame::Header));
        let mut seg = framed(b"abc");
        seg[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(read(&seg, 0, Headers::Checked), Read::Bad(BadFrame::Header));
    }

    /// Found by the simulator: a flipped bit that lengthened the last frame made it reach into
    /// the zero-filled rest of the segment, which passed for a torn write.
    #[test]
    fn a_flipped_bit_in_the_length_is_damage_not_a_torn_write() {
        for bit in 8..31 {
            let mut seg = framed(&[5u8; 100]);
            seg.resize(64 * 1024, 0);
            seg[4..8].copy_from_slice(&(100u32 ^ (1 << bit)).to_le_bytes());
            assert_eq!(
                read(&seg, 0, Headers::Checked),
                Read::Bad(BadFrame::Header),
                "bit {bit}"
            );
        }
    }

    #[test]
    fn a_format_1_header_without_its_check_reads_only_where_allowed() {
        let mut seg = framed(b"old");
        seg[12..16].copy_from_slice(&0u32.to_le_bytes());
        assert_eq!(read(&seg, 0, Headers::Checked), Read::Bad(BadFrame::Header));
        assert!(matches!(
            read(&seg, 0, Headers::CheckedOrZero),
            Read::Frame {
                payload: b"old",
                ..
            }
        ));
    }

    #[test]
    fn an_intact_frame_after_damage_is_found() {
        let mut seg = framed(&[1u8; 40]);
        let second = seg.len();
        seg.extend(framed(&[2u8; 40]));
        seg[20] ^= 1;
        assert_eq!(intact_frame_after(&seg, 8), Some(second));
        assert_eq!(intact_frame_after(&seg, second + 8), None);
    }
}
