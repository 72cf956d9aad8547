//! Building [`Extent`] lists: ordered, contiguous, adjacent extents of the same kind merged.

use crate::Extent;

/// Appends `[offset, offset+len)` to an ordered list, merging it into the last extent when that
/// one ends at `offset` and has the same kind. Empty extents are dropped.
pub(crate) fn push(list: &mut Vec<Extent>, offset: u64, len: u64, allocated: bool) {
    if len == 0 {
        return;
    }
    if let Some(last) = list.last_mut() {
        if last.allocated == allocated && last.offset + last.len == offset {
            last.len += len;
            return;
        }
    }
    list.push(Extent {
        offset,
        len,
        allocated,
    });
}

/// `list` with `[offset, offset+len)` marked `allocated`. `list` must be ordered and contiguous;
/// the painted range should lie inside what it covers.
pub(crate) fn paint(list: &[Extent], offset: u64, len: u64, allocated: bool) -> Vec<Extent> {
    let end = offset + len;
    let mut out = Vec::with_capacity(list.len() + 2);
    for e in list {
        let e_end = e.offset + e.len;
        let before_end = e_end.min(offset);
        push(
            &mut out,
            e.offset,
            before_end.saturating_sub(e.offset),
            e.allocated,
        );
        let mid_start = e.offset.max(offset);
        push(
            &mut out,
            mid_start,
            e_end.min(end).saturating_sub(mid_start),
            allocated,
        );
        let after_start = e.offset.max(end);
        push(
            &mut out,
            after_start,
            e_end.saturating_sub(after_start),
            e.allocated,
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(offset: u64, len: u64, allocated: bool) -> Extent {
        Extent {
            offset,
            len,
            allocated,
        }
    }

    #[test]
    fn push_merges_neighbours_of_one_kind() {
        let mut list = Vec::new();
        push(&mut list, 0, 10, true);
        push(&mut list, 10, 5, true);
        push(&mut list, 15, 0, false);
        push(&mut list, 15, 5, false);
        assert_eq!(list, vec![ext(0, 15, true), ext(15, 5, false)]);
    }

    #[test]
    fn paint_splits_and_merges() {
        let list = vec![ext(0, 10, true), ext(10, 10, false)];
        assert_eq!(
            paint(&list, 5, 10, false),
            vec![ext(0, 5, true), ext(5, 15, false)]
        );
        assert_eq!(
            paint(&list, 12, 3, true),
            vec![
                ext(0, 10, true),
                ext(10, 2, false),
                ext(12, 3, true),
                ext(15, 5, false)
            ]
        );
        assert_eq!(paint(&list, 0, 20, true), vec![ext(0, 20, true)]);
    }
}
