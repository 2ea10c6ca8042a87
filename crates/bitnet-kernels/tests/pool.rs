//! The thread pool: exact coverage of ragged row counts, nesting, panics.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::cast_possible_truncation
)]

use std::sync::atomic::{AtomicUsize, Ordering};

use bitnet_kernels::{part_range, Pool};

#[test]
fn part_ranges_cover_exactly() {
    for n in [0usize, 1, 7, 8, 9, 640, 2560, 6912, 128_256, 1001] {
        for grain in [1usize, 4, 8, 16] {
            for parts in 1..=5 {
                let mut next = 0;
                for i in 0..parts {
                    let r = part_range(n, grain, parts, i);
                    assert_eq!(r.start, next, "n {n} grain {grain} parts {parts}");
                    assert!(r.end >= r.start);
                    if r.end < n {
                        assert_eq!(r.end % grain, 0);
                    }
                    next = r.end;
                }
                assert_eq!(next, n);
            }
        }
    }
    // 640 rows on 2 threads with grain 8: 320 + 320.
    assert_eq!(part_range(640, 8, 2, 0), 0..320);
    assert_eq!(part_range(640, 8, 2, 1), 320..640);
    // 6912 on 3 threads: 288 units → 96 each.
    assert_eq!(part_range(6912, 8, 3, 2), 4608..6912);
}

#[test]
fn for_rows_visits_every_row_once() {
    for threads in [1usize, 2, 3, 4] {
        let pool = Pool::new(threads);
        assert_eq!(pool.n_threads(), threads);
        for n in [1usize, 5, 640, 6912, 10_007] {
            for _rep in 0..20 {
                let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                pool.for_rows(n, 8, &|r| {
                    for i in r {
                        hits[i].fetch_add(1, Ordering::Relaxed);
                    }
                });
                assert!(
                    hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                    "n {n} threads {threads}"
                );
            }
        }
    }
}

/// Every row is handed out once, as exactly its own elements of both slices, on any thread
/// count; bad shapes are refused before anything runs.
#[test]
fn row_slices_are_each_rows_own_elements() {
    for threads in [1usize, 2, 3] {
        let pool = Pool::new(threads);
        for (n, wa, wb) in [
            (1usize, 3usize, 1usize),
            (7, 5, 2),
            (128, 16, 0),
            (1001, 4, 3),
        ] {
            let mut a = vec![0u32; n * wa];
            let mut b = vec![0u16; n * wb];
            pool.for_rows_mut2(&mut a, wa, &mut b, wb, 1, &|r, ra, rb| {
                assert_eq!(ra.len(), r.len() * wa);
                assert_eq!(rb.len(), r.len() * wb);
                for (i, row) in r.clone().zip(ra.chunks_exact_mut(wa)) {
                    for (j, x) in row.iter_mut().enumerate() {
                        *x += u32::try_from(i * 100 + j).unwrap();
                    }
                }
                if wb > 0 {
                    for (i, row) in r.zip(rb.chunks_exact_mut(wb)) {
                        for x in row {
                            *x += u16::try_from(i).unwrap() + 1;
                        }
                    }
                }
            })
            .unwrap();
            for (i, row) in a.chunks_exact(wa).enumerate() {
                for (j, &x) in row.iter().enumerate() {
                    assert_eq!(
                        x,
                        u32::try_from(i * 100 + j).unwrap(),
                        "n {n} threads {threads}"
                    );
                }
            }
            for (i, &x) in b.iter().enumerate() {
                assert_eq!(x, u16::try_from(i / wb.max(1)).unwrap() + 1);
            }
            let mut one = vec![0u8; n * wa];
            pool.for_rows_mut2(&mut one, wa, &mut [(); 0], 0, 2, &|r, ra, _| {
                assert_eq!(ra.len(), r.len() * wa);
                ra.iter_mut().for_each(|x| *x += 1);
            })
            .unwrap();
            assert!(one.iter().all(|&x| x == 1));
        }
        let mut a = vec![0f32; 10];
        let never =
            |_: std::ops::Range<usize>, _: &mut [f32], _: &mut [()]| panic!("ran on a bad shape");
        assert!(pool
            .for_rows_mut2(&mut a, 0, &mut [], 0, 1, &never)
            .is_err());
        assert!(pool
            .for_rows_mut2(&mut a, 3, &mut [], 0, 1, &never)
            .is_err());
        let mut b = vec![0i8; 4];
        let never2 =
            |_: std::ops::Range<usize>, _: &mut [f32], _: &mut [i8]| panic!("ran on a bad shape");
        assert!(pool
            .for_rows_mut2(&mut a, 5, &mut b, 1, 1, &never2)
            .is_err());
        assert!(pool
            .for_rows_mut2(&mut a, 5, &mut b, 2, 1, &|_, _, _| {})
            .is_ok());
    }
}

#[test]
fn nested_calls_run_inline() {
    let pool = Pool::new(2);
    let total = AtomicUsize::new(0);
    pool.for_rows(4, 1, &|r| {
        for _ in r {
            pool.for_rows(10, 1, &|inner| {
                total.fetch_add(inner.len(), Ordering::Relaxed);
            });
        }
    });
    assert_eq!(total.load(Ordering::Relaxed), 40);
}

#[test]
fn panics_propagate_and_pool_survives() {
    let pool = Pool::new(2);
    for panicking_part in [0usize, 1] {
        let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.for_rows(100, 1, &|r| {
                if r.start == if panicking_part == 0 { 0 } else { 50 } {
                    panic!("boom");
                }
            });
        }));
        assert!(res.is_err());
        let count = AtomicUsize::new(0);
        pool.for_rows(100, 1, &|r| {
            count.fetch_add(r.len(), Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 100);
    }
}

#[test]
fn concurrent_callers_share_one_pool() {
    let pool = Pool::new(2);
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                for _ in 0..200 {
                    let c = AtomicUsize::new(0);
                    pool.for_rows(64, 4, &|r| {
                        c.fetch_add(r.len(), Ordering::Relaxed);
                    });
                    assert_eq!(c.load(Ordering::Relaxed), 64);
                }
            });
        }
    });
}

#[test]
fn pool_and_views_are_send_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Pool>();
    assert_send_sync::<bitnet_kernels::TernaryMatrix<'static>>();
    assert_send_sync::<bitnet_kernels::RowMatrix<'static>>();
}
