//! Shared test body: every collective against a sequential reference.
#![allow(dead_code)]

use ferroce_collectives::{with_dtype, Communicator, DType, Element, ReduceOp, Result};

/// Test data: values in {1, 2, −1, −2}, so every partial sum (|s| ≤ 2n) and
/// product (a power of two ≤ 2^n) of ≤ 8 ranks is exact in every type,
/// including f16/bf16. Float results are then compared bit for bit (bound 0);
/// Avg's single division is reproduced exactly by the reference.
pub fn val<T: Element>(rank: usize, i: usize) -> T {
    T::from_i64([1, 2, -1, -2][(rank * 7 + i * 3 + i / 5) % 4])
}

fn input<T: Element>(rank: usize, count: usize, salt: usize) -> Vec<T> {
    (0..count).map(|i| val::<T>(rank + salt, i)).collect()
}

/// Reference: a left fold over ranks 0..n, then Avg's division.
fn reference<T: Element>(n: usize, count: usize, salt: usize, op: ReduceOp) -> Vec<T> {
    let mut acc = input::<T>(0, count, salt);
    for r in 1..n {
        let x = input::<T>(r, count, salt);
        for (a, b) in acc.iter_mut().zip(&x) {
            *a = T::combine(op, *a, *b);
        }
    }
    ferroce_collectives::dtype::finish(op, &mut acc, n);
    acc
}

fn same<T: Element>(a: &[T], b: &[T]) -> bool {
    a.len() == b.len() && bytemuck::cast_slice::<T, u8>(a) == bytemuck::cast_slice::<T, u8>(b)
}

pub struct Plan {
    pub dtypes: Vec<DType>,
    pub counts: Vec<usize>,
    /// Reduction ops tried per dtype: all five, or one rotating with the dtype.
    pub all_ops: bool,
}

/// Run every collective of the plan; mismatches are collected, not
/// returned early, so every rank keeps calling the same sequence.
pub fn check_all(c: &Communicator<'_>, plan: &Plan) -> Result<Vec<String>> {
    let mut bad = Vec::new();
    for (di, &dt) in plan.dtypes.iter().enumerate() {
        with_dtype!(dt, T => check_type::<T>(c, plan, di, &mut bad)?);
    }
    Ok(bad)
}

fn check_type<T: Element>(
    c: &Communicator<'_>,
    plan: &Plan,
    di: usize,
    bad: &mut Vec<String>,
) -> Result<()> {
    let (n, r) = (c.size(), c.rank());
    let name = T::DTYPE.name();
    let ops: Vec<ReduceOp> = if plan.all_ops {
        ReduceOp::ALL.to_vec()
    } else {
        vec![ReduceOp::ALL[di % 5]]
    };
    for &count in &plan.counts {
        let mut fail =
            |what: String| bad.push(format!("rank {r}/{n} {name} count {count}: {what}"));
        for (oi, &op) in ops.iter().enumerate() {
            let salt = oi;
            let want = reference::<T>(n, count, salt, op);
            let mine = input::<T>(r, count, salt);
            // allreduce, alternating in-place and out-of-place.
            let mut out = vec![T::from_i64(0); count];
            if oi % 2 == 0 {
                c.allreduce(&mine, &mut out, op)?;
            } else {
                out.clone_from(&mine);
                c.allreduce_in_place(&mut out, op)?;
            }
            if !same(&out, &want) {
                fail(format!("allreduce {op:?}"));
            }
            // reduce to a root that moves with the count.
            let root = (count + oi) % n;
            let mut out = vec![T::from_i64(0); if r == root { count } else { 0 }];
            if oi % 2 == 0 {
                c.reduce(&mine, &mut out, op, root)?;
            } else {
                let mut b = mine.clone();
                c.reduce_in_place(&mut b, op, root)?;
                if r == root {
                    out = b;
                } else if !same(&b, &mine) {
                    fail(format!("reduce_in_place {op:?} changed a non-root buffer"));
                }
            }
            if r == root && !same(&out, &want) {
                fail(format!("reduce {op:?} root {root}"));
            }
            // reduce_scatter: per-rank count = count/n rounded up.
            let pc = count.div_ceil(n);
            let full_want = reference::<T>(n, pc * n, salt + 1, op);
            let full_mine = input::<T>(r, pc * n, salt + 1);
            let mut part = vec![T::from_i64(0); pc];
            if oi % 2 == 0 {
                c.reduce_scatter(&full_mine, &mut part, op)?;
            } else {
                let mut b = full_mine.clone();
                c.reduce_scatter_in_place(&mut b, op)?;
                part.copy_from_slice(&b[r * pc..(r + 1) * pc]);
            }
            if !same(&part, &full_want[r * pc..(r + 1) * pc]) {
                fail(format!("reduce_scatter {op:?}"));
            }
        }
        // broadcast from a moving root.
        let root = count % n;
        let want = input::<T>(root, count, 9);
        let mut b = if r == root {
            want.clone()
        } else {
            vec![T::from_i64(0); count]
        };
        c.broadcast(&mut b, root)?;
        if !same(&b, &want) {
            fail(format!("broadcast root {root}"));
        }
        // allgather, out of place and in place.
        let pc = count.div_ceil(n);
        let want: Vec<T> = (0..n).flat_map(|j| input::<T>(j, pc, 3)).collect();
        let mut g = vec![T::from_i64(0); pc * n];
        c.allgather(&input::<T>(r, pc, 3), &mut g)?;
        if !same(&g, &want) {
            fail("allgather".into());
        }
        let mut g = vec![T::from_i64(0); pc * n];
        g[r * pc..(r + 1) * pc].copy_from_slice(&input::<T>(r, pc, 3));
        c.allgather_in_place(&mut g)?;
        if !same(&g, &want) {
            fail("allgather_in_place".into());
        }
        // alltoall: block j from rank i is input(i*n + j).
        let send: Vec<T> = (0..n).flat_map(|j| input::<T>(r * n + j, pc, 5)).collect();
        let want: Vec<T> = (0..n).flat_map(|i| input::<T>(i * n + r, pc, 5)).collect();
        let mut got = vec![T::from_i64(0); pc * n];
        c.alltoall(&send, &mut got)?;
        if !same(&got, &want) {
            fail("alltoall".into());
        }
        // send/recv around the ring (even ranks send first: no deadlock
        // even for a blocking send, and it checks the ordered matching).
        if n > 1 {
            let (right, left) = ((r + 1) % n, (r + n - 1) % n);
            let mut got = vec![T::from_i64(0); count];
            if r % 2 == 0 {
                c.send(&input::<T>(r, count, 7), right)?;
                c.recv(&mut got, left)?;
            } else {
                c.recv(&mut got, left)?;
                c.send(&input::<T>(r, count, 7), right)?;
            }
            if !same(&got, &input::<T>(left, count, 7)) {
                fail("send/recv".into());
            }
        }
        c.barrier()?;
    }
    Ok(())
}

/// Counts for byte sizes 0, 1, 7 (elements), 4 KiB and 1 MiB + 3 elements' worth.
pub fn counts(dt: DType, big: bool) -> Vec<usize> {
    let mut v = vec![0, 1, 7, 4096 / dt.size()];
    if big {
        v.push((1 << 20) / dt.size() + 3);
    }
    v
}
