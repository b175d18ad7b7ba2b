//! Test support: hand-assembling small files page by page, for layouts the writer never makes
//! (nested buckets, over-deep trees) and for damaging files in controlled ways.

use crate::format::{
    BRANCH_PAGE, BucketHeader, FREELIST_PAGE, META_PAGE, META_SIZE, Meta, PAGE_HEADER_SIZE,
    PageHeader, Pgid,
};

/// The page size of hand-assembled files.
pub(crate) const PS: usize = 512;

/// A meta page holding `meta`.
pub(crate) fn meta_page(id: Pgid, meta: &Meta) -> Vec<u8> {
    let mut page = vec![0; PS];
    let header = PageHeader {
        id,
        flags: META_PAGE,
        count: 0,
        overflow: 0,
    };
    header.encode(&mut page);
    page[PAGE_HEADER_SIZE..PAGE_HEADER_SIZE + META_SIZE].copy_from_slice(&meta.encode());
    page
}

/// A page with one element: for a branch, `key` pointing at `child`; for a leaf, `key` ->
/// `value` with the element flags `elem_flags`.
pub(crate) fn single_element_page(
    id: Pgid,
    flags: u16,
    elem_flags: u32,
    key: &[u8],
    value: &[u8],
    child: Pgid,
) -> Vec<u8> {
    let mut page = vec![0; PS];
    PageHeader {
        id,
        flags,
        count: 1,
        overflow: 0,
    }
    .encode(&mut page);
    let elem = &mut page[16..32];
    let ksize = (key.len() as u32).to_le_bytes();
    if flags == BRANCH_PAGE {
        elem[0..4].copy_from_slice(&16u32.to_le_bytes());
        elem[4..8].copy_from_slice(&ksize);
        elem[8..16].copy_from_slice(&child.to_le_bytes());
    } else {
        elem[0..4].copy_from_slice(&elem_flags.to_le_bytes());
        elem[4..8].copy_from_slice(&16u32.to_le_bytes());
        elem[8..12].copy_from_slice(&ksize);
        elem[12..16].copy_from_slice(&(value.len() as u32).to_le_bytes());
    }
    page[32..32 + key.len()].copy_from_slice(key);
    page[32 + key.len()..32 + key.len() + value.len()].copy_from_slice(value);
    page
}

/// A whole file: both metas (txid 1), an empty freelist on page 2, then `pages` from page 3,
/// with the root bucket's tree at `root`.
pub(crate) fn assemble(pages: Vec<Vec<u8>>, root: Pgid) -> Vec<u8> {
    let meta = Meta {
        page_size: PS as u32,
        flags: 0,
        root: BucketHeader { root, sequence: 0 },
        freelist: 2,
        pgid: 3 + pages.len() as u64,
        txid: 1,
    };
    let mut bytes = meta_page(0, &meta);
    bytes.extend(meta_page(1, &meta));
    let mut freelist = vec![0; PS];
    PageHeader {
        id: 2,
        flags: FREELIST_PAGE,
        count: 0,
        overflow: 0,
    }
    .encode(&mut freelist);
    bytes.extend(freelist);
    for page in pages {
        bytes.extend(page);
    }
    bytes
}
