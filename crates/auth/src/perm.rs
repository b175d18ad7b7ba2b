//! Whether a user's grants cover a key or a range: etcd's interval semantics. Keys compare as
//! bytes; a grant or a request whose range end is `"\0"` runs to the end of the key space, and a
//! grant of one key (no range end) is the interval `[key, key + "\0")`.

use std::cmp::Ordering;

use crate::Permission;

/// What a request does to a key range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

/// An interval end: a key, or past every key.
#[derive(Clone, Debug, PartialEq, Eq)]
enum End<'a> {
    Key(std::borrow::Cow<'a, [u8]>),
    Infinite,
}

impl PartialOrd for End<'_> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for End<'_> {
    fn cmp(&self, other: &Self) -> Ordering {
        match (self, other) {
            (End::Infinite, End::Infinite) => Ordering::Equal,
            (End::Infinite, End::Key(_)) => Ordering::Greater,
            (End::Key(_), End::Infinite) => Ordering::Less,
            (End::Key(a), End::Key(b)) => a.cmp(b),
        }
    }
}

/// The end of a grant's interval.
fn grant_end(p: &Permission) -> End<'_> {
    match p.range_end.as_slice() {
        [] => {
            let mut next = p.key.clone();
            next.push(0);
            End::Key(next.into())
        }
        [0] => End::Infinite,
        end => End::Key(end.into()),
    }
}

/// Whether the grants cover `key` (`range_end` empty) or `[key, range_end)` (`"\0"`: from `key`
/// on). A range is covered when the grants that overlap it leave no gap from its start to its
/// end; touching intervals (`[a, b)` and `[b, c)`) leave none.
pub fn covers<'p>(
    granted: impl IntoIterator<Item = &'p Permission>,
    key: &[u8],
    range_end: &[u8],
) -> bool {
    let key_end = End::Key(key.into());
    if range_end.is_empty() {
        // One key: some grant holds it.
        return granted
            .into_iter()
            .any(|p| p.key.as_slice() <= key && key_end < grant_end(p));
    }
    let end = if range_end == [0] {
        End::Infinite
    } else {
        End::Key(range_end.into())
    };
    let mut overlapping: Vec<(&[u8], End<'_>)> = granted
        .into_iter()
        .map(|p| (p.key.as_slice(), grant_end(p)))
        .filter(|(begin, stop)| End::Key((*begin).into()) < end && key_end < *stop)
        .collect();
    overlapping.sort_by(|a, b| a.0.cmp(b.0));
    let Some((first, _)) = overlapping.first() else {
        return false;
    };
    if *first > key {
        return false;
    }
    let mut reached = End::Key(key.into());
    for (begin, stop) in overlapping {
        if End::Key(begin.into()) > reached {
            return false;
        }
        if stop > reached {
            reached = stop;
        }
    }
    reached >= end
}
