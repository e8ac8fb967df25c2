//! Intra-op parallelism without threads in core: a *parallel-for hook* that
//! a std layer installs (mote-std's rayon provider), and that kernels call
//! to run independent tasks.
//!
//! Core never spawns a thread or names a thread pool (STYLE.md §10): with
//! no hook set — every firmware, and every host until a provider is
//! installed — [`for_each`] is a plain loop. A kernel splits its output so
//! that every element is computed by exactly one task, in the same order of
//! operations as the single-task run, so results are bit-identical whatever
//! the number of workers. [`workers`] tells a kernel whether splitting pays
//! at all (1: don't), and [`tasks`] sizes the split so that no task is
//! smaller than [`MIN_TASK_MACS`].
//!
//! The hook lives in one atomic pointer (load/store only, which every
//! target has, thumbv6m included): no lock, no allocation.

use core::marker::PhantomData;
use core::num::NonZeroUsize;
use core::ptr;
use core::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

/// A parallel-for provider: how to run `n` tasks, and how many workers the
/// calling thread has now.
#[derive(Debug)]
pub struct Provider {
    /// Calls `f(i)` for every `i` in `0..n`, each exactly once, possibly on
    /// several threads at the same time, and returns once every call has
    /// returned.
    pub for_each: fn(n: usize, f: &(dyn Fn(usize) + Sync)),
    /// How many workers a [`Provider::for_each`] from the calling thread
    /// would use (1 when it would run the tasks in a plain loop).
    pub workers: fn() -> usize,
}

static PROVIDER: AtomicPtr<Provider> = AtomicPtr::new(ptr::null_mut());

/// Installs (`Some`) or removes (`None`) the parallel-for provider of the
/// process. Kernels already running keep the provider they started with.
///
/// # Safety
/// `p.for_each(n, f)` must call `f(i)` at most once for each `i` in `0..n`
/// (exactly once for correct results) and return only after every call it
/// made has returned: kernels hand each task a disjoint part of their
/// output through a raw pointer ([`SharedMut`]), so two concurrent calls
/// with the same `i` would be a data race.
pub unsafe fn set_provider(p: Option<&'static Provider>) {
    let raw = p.map_or(ptr::null_mut(), |p| ptr::from_ref(p).cast_mut());
    PROVIDER.store(raw, Ordering::Release);
}

fn provider() -> Option<&'static Provider> {
    let raw = PROVIDER.load(Ordering::Acquire);
    // SAFETY: PROVIDER is null or was stored from a `&'static Provider` by
    // `set_provider`; it is never written through.
    unsafe { raw.as_ref() }
}

/// Workers available to the calling thread: 1 with no provider.
pub fn workers() -> usize {
    provider().map_or(1, |p| (p.workers)().max(1))
}

/// Runs `f(i)` for `i` in `0..n`: on the provider when one is set and
/// `n > 1`, else in order on this thread.
pub(crate) fn for_each(n: usize, f: &(dyn Fn(usize) + Sync)) {
    match provider() {
        Some(p) if n > 1 => (p.for_each)(n, f),
        _ => (0..n).for_each(f),
    }
}

/// Smallest task worth handing to another worker, in multiply-adds (about
/// 10–20 µs of one core): below it the hand-off costs more than it saves.
#[cfg(not(miri))]
pub(crate) const MIN_TASK_MACS: usize = 1 << 16;
/// Under Miri, small enough that the tests' small convolutions split, so
/// that the parallel paths (and their `unsafe` output views) are
/// interpreted in minutes, not hours.
#[cfg(miri)]
pub(crate) const MIN_TASK_MACS: usize = 64;

/// Integer multiply-adds per unit of `work` that [`tasks_int8`] counts: the
/// int8 kernels do up to four in an f32 one's time (VNNI: four per lane and
/// instruction), so a task worth handing off holds four times as many.
/// Measured with two threads on the AVX-512 VNNI Xeon of the README's
/// benchmark: KWS int8 0.166 ms (min) when its 512 K-MAC pointwise layers
/// were cut into 8 tasks, 0.127 ms with 2, against 0.125 ms on one thread.
const INT8_MACS_PER_UNIT: usize = 4;

/// [`tasks`] for `macs` int8 multiply-adds.
pub(crate) fn tasks_int8(workers: usize, macs: usize, max_tasks: usize) -> usize {
    tasks(workers, macs / INT8_MACS_PER_UNIT, max_tasks)
}

/// How many tasks to cut `work` multiply-adds into for `workers` workers: at
/// most `max_tasks` (the number of independent units), about four per
/// worker so that an unevenly loaded machine still balances, and none
/// below [`MIN_TASK_MACS`]. 1 means "run it here".
pub(crate) fn tasks(workers: usize, work: usize, max_tasks: usize) -> usize {
    if workers <= 1 {
        return 1;
    }
    (work / MIN_TASK_MACS)
        .min(workers.saturating_mul(4))
        .min(max_tasks)
        .max(1)
}

/// The range of units `[lo, hi)` of task `t` when `units` are cut into
/// `tasks` contiguous, nearly equal ranges.
pub(crate) fn chunk(units: usize, tasks: usize, t: usize) -> (usize, usize) {
    let tasks = NonZeroUsize::new(tasks).unwrap_or(NonZeroUsize::MIN);
    if t >= tasks.get() {
        return (units, units);
    }
    let (q, r) = (units / tasks, units % tasks);
    // t < tasks: t * q + min(t, r) <= units, and hi <= units likewise.
    let lo = t.wrapping_mul(q).wrapping_add(t.min(r));
    let hi = lo.wrapping_add(q).wrapping_add(usize::from(t < r));
    (lo.min(units), hi.min(units))
}

/// A mutable slice shared by the tasks of one [`for_each`], each of which
/// writes its own disjoint part of it.
#[derive(Debug)]
pub(crate) struct SharedMut<'a, T> {
    ptr: *mut T,
    len: usize,
    _borrow: PhantomData<&'a mut [T]>,
}

// SAFETY: a `SharedMut` is a `&mut [T]` split among tasks; handing parts of
// it to other threads needs `T: Send`, and `slice`'s contract keeps the
// parts disjoint.
unsafe impl<T: Send> Send for SharedMut<'_, T> {}
// SAFETY: as above: shared access only hands out disjoint parts.
unsafe impl<T: Send> Sync for SharedMut<'_, T> {}

impl<'a, T> SharedMut<'a, T> {
    /// Borrows `s` mutably for as long as the handle lives.
    pub(crate) fn new(s: &'a mut [T]) -> Self {
        SharedMut {
            ptr: s.as_mut_ptr(),
            len: s.len(),
            _borrow: PhantomData,
        }
    }

    /// The slice's first element, for a kernel whose tasks each write a
    /// strided part of it (rows of every plane). Writing through it is
    /// `unsafe`: within the slice, and no two tasks touching the same
    /// element.
    // Used by the x86_64 direct Conv kernel only (`kern::dconv`).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn as_mut_ptr(&self) -> *mut T {
        self.ptr
    }

    /// The slice's length.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// `&mut s[start..start + len]`, or `None` when that is out of bounds.
    ///
    /// # Safety
    /// No two slices obtained from this handle and alive at the same time
    /// may overlap (each task asks only for the part it owns).
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice(&self, start: usize, len: usize) -> Option<&mut [T]> {
        let end = start.checked_add(len)?;
        if end > self.len {
            return None;
        }
        // SAFETY: `start..end` lies inside the slice `new` borrowed for 'a
        // (checked above), and the caller guarantees no other live slice
        // from this handle overlaps it.
        Some(unsafe { core::slice::from_raw_parts_mut(self.ptr.add(start), len) })
    }
}

/// Set by a task that could not do its part (a bound a kernel re-checks
/// failed), read once every task has returned.
#[derive(Debug, Default)]
pub(crate) struct Failed(AtomicBool);

impl Failed {
    pub(crate) fn new() -> Self {
        Failed(AtomicBool::new(false))
    }
    pub(crate) fn set(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
    pub(crate) fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Test providers: std threads, `WORKERS` of them, plus a lock that tests
/// changing the process-wide provider hold (cargo runs tests in parallel).
#[cfg(test)]
pub(crate) mod testing {
    extern crate std;
    use super::*;
    use std::sync::{Mutex, MutexGuard};
    use std::vec::Vec;

    static LOCK: Mutex<()> = Mutex::new(());

    std::thread_local! {
        static CALLS: core::cell::Cell<usize> = const { core::cell::Cell::new(0) };
    }

    /// How many times this thread handed tasks to a test provider.
    pub(crate) fn split_calls() -> usize {
        CALLS.with(|c| c.get())
    }

    fn scoped<const W: usize>(n: usize, f: &(dyn Fn(usize) + Sync)) {
        CALLS.with(|c| c.set(c.get() + 1));
        // Worker w runs tasks w, w + W, ...: every index exactly once.
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..W.min(n))
                .map(|w| s.spawn(move || (w..n).step_by(W).for_each(f)))
                .collect();
            for h in hs {
                assert!(h.join().is_ok(), "a task panicked");
            }
        });
    }

    fn one() -> usize {
        1
    }
    fn two() -> usize {
        2
    }
    fn three() -> usize {
        3
    }

    static SERIAL: Provider = Provider {
        for_each: scoped::<1>,
        workers: one,
    };
    static TWO: Provider = Provider {
        for_each: scoped::<2>,
        workers: two,
    };
    static THREE: Provider = Provider {
        for_each: scoped::<3>,
        workers: three,
    };

    /// Holds the provider of the process while alive; removes it on drop.
    pub(crate) struct With(#[allow(dead_code)] MutexGuard<'static, ()>);

    impl Drop for With {
        fn drop(&mut self) {
            // SAFETY: removing the provider is always sound.
            unsafe { set_provider(None) };
        }
    }

    /// Installs a provider of `workers` (1, 2 or 3) std threads; none for 0.
    pub(crate) fn with(workers: usize) -> With {
        let guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let p: Option<&'static Provider> = match workers {
            0 => None,
            1 => Some(&SERIAL),
            2 => Some(&TWO),
            _ => Some(&THREE),
        };
        // SAFETY: `scoped` calls each index once and joins every thread.
        unsafe { set_provider(p) };
        With(guard)
    }

    /// Runs `f` with no provider, then with 2 and 3 workers, and returns
    /// the three results.
    pub(crate) fn each<R>(mut f: impl FnMut() -> R) -> [R; 3] {
        let r1 = {
            let _g = with(0);
            f()
        };
        let r2 = {
            let _g = with(2);
            f()
        };
        let r3 = {
            let _g = with(3);
            f()
        };
        [r1, r2, r3]
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use core::sync::atomic::AtomicUsize;
    use std::vec::Vec;

    #[test]
    fn each_index_runs_exactly_once() {
        for w in [1, 2, 3] {
            let _g = testing::with(w);
            assert_eq!(workers(), w);
            for n in [0, 1, 2, 3, 7, 64] {
                let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                let threads = std::sync::Mutex::new(std::collections::HashSet::new());
                for_each(n, &|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                    if let Ok(mut t) = threads.lock() {
                        t.insert(std::thread::current().id());
                    }
                });
                assert!(
                    hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                    "w{w} n{n}"
                );
                let used = threads.lock().map(|t| t.len()).unwrap_or(0);
                assert!(used <= w.max(1), "w{w} n{n}: {used} threads");
                if n >= 3 && w > 1 {
                    assert!(used > 1, "w{w} n{n}: ran on one thread");
                }
            }
        }
    }

    #[test]
    fn no_provider_is_one_sequential_worker() {
        let _g = testing::with(0);
        assert_eq!(workers(), 1);
        let order = std::sync::Mutex::new(Vec::new());
        for_each(5, &|i| {
            order.lock().unwrap_or_else(|e| e.into_inner()).push(i)
        });
        assert_eq!(
            *order.lock().unwrap_or_else(|e| e.into_inner()),
            [0, 1, 2, 3, 4]
        );
    }

    #[test]
    fn chunks_cover_every_unit_once() {
        for units in [0, 1, 5, 16, 17] {
            for t in 1..=8 {
                let mut next = 0;
                for i in 0..t {
                    let (lo, hi) = chunk(units, t, i);
                    assert_eq!(lo, next, "units{units} tasks{t}");
                    assert!(hi >= lo);
                    next = hi;
                }
                assert_eq!(next, units);
            }
        }
    }

    #[test]
    fn small_work_is_not_split() {
        assert_eq!(tasks(1, usize::MAX, 100), 1);
        assert_eq!(tasks(4, MIN_TASK_MACS - 1, 100), 1);
        assert_eq!(tasks(2, 3 * MIN_TASK_MACS, 100), 3);
        assert_eq!(tasks(2, 100 * MIN_TASK_MACS, 100), 8);
        assert_eq!(tasks(2, 100 * MIN_TASK_MACS, 5), 5);
        assert_eq!(tasks(2, 100 * MIN_TASK_MACS, 0), 1);
        assert_eq!(tasks_int8(2, 4 * MIN_TASK_MACS, 100), 1);
        assert_eq!(tasks_int8(2, 8 * MIN_TASK_MACS, 100), 2);
    }

    #[test]
    fn shared_slices_are_bounds_checked() {
        let mut v = [0u32; 8];
        let s = SharedMut::new(&mut v);
        // SAFETY: the slices below are disjoint or not kept.
        unsafe {
            assert!(s.slice(4, 5).is_none());
            assert!(s.slice(usize::MAX, 2).is_none());
            let (a, b) = (s.slice(0, 4), s.slice(4, 4));
            if let (Some(a), Some(b)) = (a, b) {
                a.fill(1);
                b.fill(2);
            }
        }
        assert_eq!(v, [1, 1, 1, 1, 2, 2, 2, 2]);
    }
}
