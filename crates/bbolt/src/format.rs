//! The bbolt on-disk format: constants, and encoding and decoding of the fixed-size structures
//! (page header, meta, leaf and branch elements, bucket header). Everything is little-endian.
//!
//! A file is a sequence of pages of `page_size` bytes; page `n` starts at byte `n * page_size`.
//! Pages 0 and 1 hold the two meta records; the one with the higher transaction id that passes
//! validation describes the file. A page whose header says `overflow = k` spans `k + 1`
//! contiguous pages.

use crate::error::Error;

/// The magic number at the start of every meta record.
pub const MAGIC: u32 = 0xED0C_DAED;
/// The only file-format version bbolt v1.3.x reads and writes.
pub const VERSION: u32 = 2;
/// The page size the writer uses by default (bbolt's default on common platforms).
pub const DEFAULT_PAGE_SIZE: u32 = 4096;
/// The smallest page size the reader accepts.
pub const MIN_PAGE_SIZE: u32 = 512;
/// The largest page size the reader accepts.
pub const MAX_PAGE_SIZE: u32 = 1 << 20;
/// The meta record's freelist field when the freelist is not stored in the file.
pub const NO_FREELIST: u64 = u64::MAX;

/// Size of a page header: id u64, flags u16, count u16, overflow u32.
pub const PAGE_HEADER_SIZE: usize = 16;
/// Size of one leaf element: flags u32, pos u32, ksize u32, vsize u32.
pub const LEAF_ELEMENT_SIZE: usize = 16;
/// Size of one branch element: pos u32, ksize u32, pgid u64.
pub const BRANCH_ELEMENT_SIZE: usize = 16;
/// Size of a bucket header (the value of a bucket's key): root pgid u64, sequence u64.
pub const BUCKET_HEADER_SIZE: usize = 16;
/// Size of the meta record that follows the page header on pages 0 and 1.
pub const META_SIZE: usize = 64;
/// Offset, within the meta record, of its checksum; the checksum covers the bytes before it.
const META_CHECKSUM_OFFSET: usize = 56;

/// Page flag: a branch (interior) page of a B+tree.
pub const BRANCH_PAGE: u16 = 0x01;
/// Page flag: a leaf page of a B+tree.
pub const LEAF_PAGE: u16 = 0x02;
/// Page flag: a meta page.
pub const META_PAGE: u16 = 0x04;
/// Page flag: the freelist page.
pub const FREELIST_PAGE: u16 = 0x10;
/// Leaf element flag: the element's value is a nested bucket's header.
pub const BUCKET_LEAF_FLAG: u32 = 0x01;

/// A page's id, the number of `page_size` blocks before it in the file.
pub type Pgid = u64;

/// The header at the start of every page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageHeader {
    pub id: Pgid,
    pub flags: u16,
    pub count: u16,
    pub overflow: u32,
}

impl PageHeader {
    /// Decodes the header at the start of `page` (which must be at least 16 bytes long).
    pub fn decode(page: &[u8]) -> PageHeader {
        PageHeader {
            id: read_u64(page, 0),
            flags: read_u16(page, 8),
            count: read_u16(page, 10),
            overflow: read_u32(page, 12),
        }
    }

    /// Writes the header into the first 16 bytes of `page`.
    pub fn encode(&self, page: &mut [u8]) {
        page[0..8].copy_from_slice(&self.id.to_le_bytes());
        page[8..10].copy_from_slice(&self.flags.to_le_bytes());
        page[10..12].copy_from_slice(&self.count.to_le_bytes());
        page[12..16].copy_from_slice(&self.overflow.to_le_bytes());
    }
}

/// A bucket header: where a bucket's B+tree starts (0 for an inline bucket) and its sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BucketHeader {
    pub root: Pgid,
    pub sequence: u64,
}

impl BucketHeader {
    /// Decodes the header at the start of a bucket value, if the value is long enough.
    pub fn decode(value: &[u8]) -> Option<BucketHeader> {
        (value.len() >= BUCKET_HEADER_SIZE).then(|| BucketHeader {
            root: read_u64(value, 0),
            sequence: read_u64(value, 8),
        })
    }

    /// The 16 encoded bytes.
    pub fn encode(&self) -> [u8; BUCKET_HEADER_SIZE] {
        let mut out = [0; BUCKET_HEADER_SIZE];
        out[0..8].copy_from_slice(&self.root.to_le_bytes());
        out[8..16].copy_from_slice(&self.sequence.to_le_bytes());
        out
    }
}

/// The meta record of page 0 or 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    pub page_size: u32,
    pub flags: u32,
    pub root: BucketHeader,
    pub freelist: Pgid,
    /// The high-water mark: the number of pages in use; every page id is below it.
    pub pgid: Pgid,
    pub txid: u64,
}

impl Meta {
    /// Decodes and validates (magic, version, checksum) the meta record at the start of `bytes`.
    /// `page` (0 or 1) only labels errors.
    pub fn decode(bytes: &[u8], page: Pgid) -> Result<Meta, Error> {
        if bytes.len() < META_SIZE || read_u32(bytes, 0) != MAGIC {
            return Err(Error::BadMagic);
        }
        let version = read_u32(bytes, 4);
        if version != VERSION {
            return Err(Error::UnsupportedVersion(version));
        }
        let stored = read_u64(bytes, META_CHECKSUM_OFFSET);
        if stored != fnv1a64(&bytes[..META_CHECKSUM_OFFSET]) {
            return Err(Error::MetaChecksum { page });
        }
        Ok(Meta {
            page_size: read_u32(bytes, 8),
            flags: read_u32(bytes, 12),
            root: BucketHeader {
                root: read_u64(bytes, 16),
                sequence: read_u64(bytes, 24),
            },
            freelist: read_u64(bytes, 32),
            pgid: read_u64(bytes, 40),
            txid: read_u64(bytes, 48),
        })
    }

    /// The 64 encoded bytes, checksum included.
    pub fn encode(&self) -> [u8; META_SIZE] {
        let mut out = [0; META_SIZE];
        out[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        out[4..8].copy_from_slice(&VERSION.to_le_bytes());
        out[8..12].copy_from_slice(&self.page_size.to_le_bytes());
        out[12..16].copy_from_slice(&self.flags.to_le_bytes());
        out[16..32].copy_from_slice(&self.root.encode());
        out[32..40].copy_from_slice(&self.freelist.to_le_bytes());
        out[40..48].copy_from_slice(&self.pgid.to_le_bytes());
        out[48..56].copy_from_slice(&self.txid.to_le_bytes());
        let sum = fnv1a64(&out[..META_CHECKSUM_OFFSET]);
        out[META_CHECKSUM_OFFSET..].copy_from_slice(&sum.to_le_bytes());
        out
    }
}

/// 64-bit FNV-1a, the hash bbolt uses for the meta checksum.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes.iter().fold(OFFSET_BASIS, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(PRIME)
    })
}

/// Reads a little-endian u16 at `at`; the caller guarantees the bytes exist.
pub fn read_u16(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}

/// Reads a little-endian u32 at `at`; the caller guarantees the bytes exist.
pub fn read_u32(bytes: &[u8], at: usize) -> u32 {
    let mut b = [0; 4];
    b.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(b)
}

/// Reads a little-endian u64 at `at`; the caller guarantees the bytes exist.
pub fn read_u64(bytes: &[u8], at: usize) -> u64 {
    let mut b = [0; 8];
    b.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a64_matches_reference_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn meta_round_trips_and_detects_corruption() {
        let meta = Meta {
            page_size: 4096,
            flags: 0,
            root: BucketHeader {
                root: 7,
                sequence: 3,
            },
            freelist: 2,
            pgid: 9,
            txid: 42,
        };
        let mut bytes = meta.encode();
        assert_eq!(Meta::decode(&bytes, 0).unwrap(), meta);
        bytes[20] ^= 1;
        assert!(matches!(
            Meta::decode(&bytes, 0),
            Err(Error::MetaChecksum { page: 0 })
        ));
        bytes[0] ^= 1;
        assert!(matches!(Meta::decode(&bytes, 0), Err(Error::BadMagic)));
    }

    #[test]
    fn page_header_round_trips() {
        let header = PageHeader {
            id: 0x0102_0304_0506_0708,
            flags: LEAF_PAGE,
            count: 9,
            overflow: 3,
        };
        let mut page = [0u8; 16];
        header.encode(&mut page);
        assert_eq!(PageHeader::decode(&page), header);
        assert_eq!(page[0], 0x08, "little-endian");
    }
}
