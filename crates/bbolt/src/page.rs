//! Decoding the elements of leaf and branch pages, with every offset and length checked against
//! the page's bytes, so a corrupt page yields an error, never a panic or an out-of-bounds read.

use crate::error::Error;
use crate::format::{
    BRANCH_ELEMENT_SIZE, LEAF_ELEMENT_SIZE, PAGE_HEADER_SIZE, Pgid, read_u32, read_u64,
};

/// One entry of a leaf page: a key and its value, or a nested bucket's name and header.
#[derive(Debug, Clone, Copy)]
pub struct LeafElement<'a> {
    pub flags: u32,
    pub key: &'a [u8],
    pub value: &'a [u8],
}

/// One entry of a branch page: the smallest key of a child and the child's page id.
#[derive(Debug, Clone, Copy)]
pub struct BranchElement<'a> {
    pub key: &'a [u8],
    pub child: Pgid,
}

/// Where element `index` starts, if its fixed-size part lies within `page`.
fn element_offset(page: &[u8], pgid: Pgid, index: usize, size: usize) -> Result<usize, Error> {
    let out_of_bounds = || Error::ElementOutOfBounds { page: pgid, index };
    let start = index
        .checked_mul(size)
        .and_then(|o| o.checked_add(PAGE_HEADER_SIZE));
    match start {
        Some(start) if start.checked_add(size).is_some_and(|end| end <= page.len()) => Ok(start),
        _ => Err(out_of_bounds()),
    }
}

/// The bytes `pos .. pos + len` counted from `elem_start`, if they lie within `page`.
fn element_bytes(
    page: &[u8],
    pgid: Pgid,
    index: usize,
    elem_start: usize,
    pos: u32,
    len: u64,
) -> Result<&[u8], Error> {
    let start = elem_start as u64 + u64::from(pos);
    let end = start
        .checked_add(len)
        .filter(|&end| end <= page.len() as u64);
    match end {
        // Both fit in usize: they are at most page.len().
        Some(end) => Ok(&page[start as usize..end as usize]),
        None => Err(Error::ElementOutOfBounds { page: pgid, index }),
    }
}

/// Decodes leaf element `index` of `page` (labelled `pgid` in errors).
pub fn leaf_element(page: &[u8], pgid: Pgid, index: usize) -> Result<LeafElement<'_>, Error> {
    let at = element_offset(page, pgid, index, LEAF_ELEMENT_SIZE)?;
    let flags = read_u32(page, at);
    let pos = read_u32(page, at + 4);
    let ksize = u64::from(read_u32(page, at + 8));
    let vsize = u64::from(read_u32(page, at + 12));
    let both = element_bytes(page, pgid, index, at, pos, ksize + vsize)?;
    let (key, value) = both.split_at(ksize as usize);
    Ok(LeafElement { flags, key, value })
}

/// Decodes branch element `index` of `page` (labelled `pgid` in errors).
pub fn branch_element(page: &[u8], pgid: Pgid, index: usize) -> Result<BranchElement<'_>, Error> {
    let at = element_offset(page, pgid, index, BRANCH_ELEMENT_SIZE)?;
    let pos = read_u32(page, at);
    let ksize = u64::from(read_u32(page, at + 4));
    let child = read_u64(page, at + 8);
    let key = element_bytes(page, pgid, index, at, pos, ksize)?;
    Ok(BranchElement { key, child })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf_with(pos: u32, ksize: u32, vsize: u32, len: usize) -> Vec<u8> {
        let mut page = vec![0u8; len];
        page[16..20].copy_from_slice(&0u32.to_le_bytes());
        page[20..24].copy_from_slice(&pos.to_le_bytes());
        page[24..28].copy_from_slice(&ksize.to_le_bytes());
        page[28..32].copy_from_slice(&vsize.to_le_bytes());
        page
    }

    #[test]
    fn decodes_an_element_within_the_page() {
        let mut page = leaf_with(16, 2, 3, 64);
        page[32..37].copy_from_slice(b"abxyz");
        let elem = leaf_element(&page, 5, 0).unwrap();
        assert_eq!((elem.key, elem.value), (&b"ab"[..], &b"xyz"[..]));
    }

    #[test]
    fn rejects_elements_beyond_the_page() {
        let page = leaf_with(16, 2, 40, 64);
        assert!(matches!(
            leaf_element(&page, 5, 0),
            Err(Error::ElementOutOfBounds { page: 5, index: 0 })
        ));
        let page = leaf_with(u32::MAX, u32::MAX, u32::MAX, 64);
        assert!(leaf_element(&page, 5, 0).is_err());
        assert!(
            leaf_element(&page, 5, 3).is_err(),
            "element header itself beyond the page"
        );
        assert!(branch_element(&page, 5, usize::MAX).is_err());
    }
}
