//! Static memory planning: where in the arena each buffer lives.
//!
//! Input: buffers with a byte size and a lifetime `[first, last]` in step
//! indices (inclusive). Output: one offset per buffer such that two buffers
//! whose lifetimes intersect never overlap in memory.
//!
//! ```text
//!  offset ▲
//!         │        ┌──────┐
//!         │ ┌──────┤  C   ├────┐     A, B, C, D: buffers; a buffer's width is
//!         │ │  B   └──────┘ D  │     its lifetime in steps, its height its
//!         │ ├──────────┐  ┌────┘     size. Two boxes may share rows only if
//!         │ │    A     │  │ E        their step ranges do not intersect.
//!         └─┴──────────┴──┴────────▶ step
//! ```
//!
//! [`GreedyBySize`] is TFLM's greedy planner with best fit: largest buffers
//! first, each at the lowest-waste gap among the buffers already placed
//! that are alive at the same time; it also tries two other orders
//! (largest size × lifetime first, earliest first) and keeps the smallest. [`lower_bound`] is the most bytes alive
//! at any one step; no planner can go below it.

use alloc::vec::Vec;

use crate::error::{Error, ErrorKind, Result};

/// Alignment of every arena buffer, in bytes (enough for any dtype and for
/// 128-bit SIMD loads).
pub const ALIGN: usize = 16;

/// One buffer to place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Buffer {
    /// Bytes.
    pub size: usize,
    /// First step at which it is alive.
    pub first: usize,
    /// Last step at which it is alive (inclusive).
    pub last: usize,
}

impl Buffer {
    fn overlaps_in_time(&self, o: &Buffer) -> bool {
        self.first <= o.last && o.first <= self.last
    }
}

/// Rounds up to [`ALIGN`].
pub fn align_up(n: usize) -> Option<usize> {
    n.checked_add(ALIGN - 1).map(|v| v & !(ALIGN - 1))
}

/// A memory planner: assigns offsets to buffers.
pub trait MemoryPlanner {
    /// One offset per buffer, each a multiple of [`ALIGN`].
    fn place(&self, buffers: &[Buffer]) -> Result<Vec<usize>>;
}

/// Greedy by size with best fit (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct GreedyBySize;

impl MemoryPlanner for GreedyBySize {
    fn place(&self, buffers: &[Buffer]) -> Result<Vec<usize>> {
        // Largest first is TFLM's order. A few other orders cost little at
        // build time and sometimes pack tighter; keep the smallest arena
        // (first one wins ties, so the result is deterministic).
        let orders: [fn(&Buffer, &Buffer) -> core::cmp::Ordering; 3] = [
            |x, y| y.size.cmp(&x.size).then(x.first.cmp(&y.first)),
            |x, y| {
                let (ax, ay) = (area(x), area(y));
                ay.cmp(&ax).then(y.size.cmp(&x.size))
            },
            |x, y| x.first.cmp(&y.first).then(y.size.cmp(&x.size)),
        ];
        let mut best: Option<(usize, Vec<usize>)> = None;
        for cmp in orders {
            let mut order: Vec<(usize, &Buffer)> = buffers.iter().enumerate().collect();
            order.sort_by(|(a, x), (b, y)| cmp(x, y).then(a.cmp(b)));
            let order: Vec<usize> = order.into_iter().map(|(i, _)| i).collect();
            let offsets = place_in_order(buffers, &order)?;
            let size = arena_size(buffers, &offsets)?;
            if best.as_ref().is_none_or(|(s, _)| size < *s) {
                best = Some((size, offsets));
            }
        }
        Ok(best.map(|(_, o)| o).unwrap_or_default())
    }
}

/// Size × lifetime: how much of the (step, byte) plane a buffer covers.
fn area(b: &Buffer) -> usize {
    b.size
        .saturating_mul(b.last.saturating_sub(b.first).saturating_add(1))
}

/// Places buffers one by one in `order`, each in the smallest gap that fits
/// among already placed buffers alive at the same time (best fit).
fn place_in_order(buffers: &[Buffer], order: &[usize]) -> Result<Vec<usize>> {
    let mut offsets = alloc::vec![usize::MAX; buffers.len()];
    // Placed buffers with their offsets.
    let mut placed: Vec<(Buffer, usize)> = Vec::with_capacity(buffers.len());
    let mut live: Vec<(usize, usize)> = Vec::new();
    for &i in order {
        let b = *buffers
            .get(i)
            .ok_or(Error::new(ErrorKind::Internal("planner: order index")))?;
        let size = align_up(b.size).ok_or(Error::new(ErrorKind::Overflow))?;
        live.clear();
        for (p, off) in &placed {
            if p.overlaps_in_time(&b) && p.size > 0 {
                let end = off
                    .checked_add(align_up(p.size).ok_or(Error::new(ErrorKind::Overflow))?)
                    .ok_or(Error::new(ErrorKind::Overflow))?;
                live.push((*off, end));
            }
        }
        live.sort_unstable();
        let mut best: Option<(usize, usize)> = None; // (waste, offset)
        let mut cursor = 0usize;
        for &(s, e) in &live {
            let gap = s.checked_sub(cursor).filter(|&gap| gap > 0);
            if let Some(waste) = gap.and_then(|gap| gap.checked_sub(size)) {
                if best.is_none_or(|(w, _)| waste < w) {
                    best = Some((waste, cursor));
                }
            }
            cursor = cursor.max(e);
        }
        let off = match best {
            Some((_, off)) => off,
            None => cursor,
        };
        *offsets
            .get_mut(i)
            .ok_or(Error::new(ErrorKind::Internal("planner: order index")))? = off;
        placed.push((b, off));
    }
    Ok(offsets)
}

/// Bytes the arena needs for `offsets` (end of the highest buffer).
pub fn arena_size(buffers: &[Buffer], offsets: &[usize]) -> Result<usize> {
    let mut top = 0usize;
    for (b, &o) in buffers.iter().zip(offsets) {
        if b.size == 0 {
            continue;
        }
        let end = o
            .checked_add(align_up(b.size).ok_or(Error::new(ErrorKind::Overflow))?)
            .ok_or(Error::new(ErrorKind::Overflow))?;
        top = top.max(end);
    }
    Ok(top)
}

/// Maximum over steps of the (aligned) bytes alive at that step.
pub fn lower_bound(buffers: &[Buffer]) -> Result<usize> {
    // Sweep over step boundaries: +size at first, -size after last.
    let mut events: Vec<(usize, bool, usize)> = Vec::with_capacity(buffers.len().saturating_mul(2));
    for b in buffers {
        let s = align_up(b.size).ok_or(Error::new(ErrorKind::Overflow))?;
        events.push((b.first, true, s));
        events.push((b.last.saturating_add(1), false, s));
    }
    // At equal step, releases (false) come before allocations (true).
    events.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut cur, mut peak) = (0usize, 0usize);
    for (_, alloc, s) in events {
        if alloc {
            cur = cur.checked_add(s).ok_or(Error::new(ErrorKind::Overflow))?;
            peak = peak.max(cur);
        } else {
            cur = cur.saturating_sub(s);
        }
    }
    Ok(peak)
}

/// Checks that no two time-overlapping buffers overlap in memory.
pub fn check_no_overlap(buffers: &[Buffer], offsets: &[usize]) -> bool {
    if offsets.len() != buffers.len() {
        return false;
    }
    let placed = || buffers.iter().zip(offsets.iter().copied());
    for (i, (a, oa)) in placed().enumerate() {
        for (b, ob) in placed().skip(i.saturating_add(1)) {
            if a.size == 0 || b.size == 0 || !a.overlaps_in_time(b) {
                continue;
            }
            if oa < ob.saturating_add(b.size) && ob < oa.saturating_add(a.size) {
                return false;
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(size: usize, first: usize, last: usize) -> Buffer {
        Buffer { size, first, last }
    }

    #[test]
    fn chain_ping_pongs() {
        // x0 -> x1 -> x2 -> x3: at most two alive at a time.
        let bufs = [b(64, 0, 1), b(32, 1, 2), b(64, 2, 3), b(16, 3, 3)];
        let off = GreedyBySize.place(&bufs).unwrap();
        assert!(check_no_overlap(&bufs, &off));
        assert_eq!(lower_bound(&bufs).unwrap(), 96);
        assert_eq!(arena_size(&bufs, &off).unwrap(), 96);
    }

    #[test]
    fn other_orders_close_the_largest_first_gap() {
        // Sizes align to 112, 64, 64, 112. Largest-first alone puts both
        // 112s at offset 0 and needs 240; the optimum (c below d) is 176,
        // the lower bound, which the size x lifetime order finds.
        let bufs = [b(100, 0, 1), b(50, 1, 3), b(50, 2, 4), b(100, 4, 5)];
        let largest_first = place_in_order(&bufs, &[0, 3, 1, 2]).unwrap();
        assert_eq!(arena_size(&bufs, &largest_first).unwrap(), 240);
        let off = GreedyBySize.place(&bufs).unwrap();
        assert!(check_no_overlap(&bufs, &off));
        assert_eq!(lower_bound(&bufs).unwrap(), 176);
        assert_eq!(arena_size(&bufs, &off).unwrap(), 176);
    }

    #[test]
    fn random_cases_never_overlap() {
        let mut seed = 0x1234_5678u64;
        let mut rnd = |m: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % m as u64) as usize
        };
        for _ in 0..200 {
            let n = 1 + rnd(30);
            let bufs: Vec<Buffer> = (0..n)
                .map(|_| {
                    let f = rnd(20);
                    b(rnd(5000), f, f + rnd(6))
                })
                .collect();
            let off = GreedyBySize.place(&bufs).unwrap();
            assert!(check_no_overlap(&bufs, &off));
            assert!(off.iter().all(|o| o % ALIGN == 0));
            let size = arena_size(&bufs, &off).unwrap();
            assert!(size >= lower_bound(&bufs).unwrap());
        }
    }
}
