//! Every op × dtype × ranks {1,2,3,4,7,8} × sizes over the in-process
//! channel transport: checks the algorithms (both allreduce algorithms and
//! both tree algorithms forced, then auto).

mod common;

use ferroce_collectives::world::{run, Fabric, TEST_TIMEOUT};
use ferroce_collectives::{Algorithms, AllreduceAlgo, DType, RdmaConfig, TreeAlgo};

fn cfg() -> RdmaConfig {
    RdmaConfig {
        timeout: TEST_TIMEOUT,
        ..Default::default()
    }
}

fn matrix(algos: Algorithms, big: bool) {
    for n in [1, 2, 3, 4, 7, 8] {
        for dt in DType::ALL {
            let plan = common::Plan {
                dtypes: vec![dt],
                // 1 MiB + 3 only for four dtypes of four widths (CI time).
                counts: common::counts(
                    dt,
                    big && matches!(dt, DType::F32 | DType::Bf16 | DType::I8 | DType::U64),
                ),
                all_ops: true,
            };
            let res = run(Fabric::Local, n, cfg(), |c| {
                let mut c = c.split(0, 0)?; // exercise split(…) as the world
                c.set_algorithms(algos);
                common::check_all(&c, &plan)
            })
            .unwrap();
            for (r, x) in res.into_iter().enumerate() {
                let bad = x.unwrap_or_else(|e| panic!("{n} ranks, {dt:?}, rank {r}: {e}"));
                assert!(bad.is_empty(), "{bad:#?}");
            }
        }
    }
}

#[test]
fn auto_all_sizes() {
    matrix(Algorithms::default(), true);
}

#[test]
fn forced_ring_and_chain() {
    matrix(
        Algorithms {
            allreduce: AllreduceAlgo::Ring,
            broadcast: TreeAlgo::Chain,
            reduce: TreeAlgo::Chain,
            segment_bytes: 1024,
            ..Default::default()
        },
        false,
    );
}

#[test]
fn forced_recursive_doubling_and_binomial() {
    matrix(
        Algorithms {
            allreduce: AllreduceAlgo::RecursiveDoubling,
            broadcast: TreeAlgo::Binomial,
            reduce: TreeAlgo::Binomial,
            ..Default::default()
        },
        false,
    );
}

#[test]
fn forced_rabenseifner() {
    matrix(
        Algorithms {
            allreduce: AllreduceAlgo::Rabenseifner,
            ..Default::default()
        },
        true,
    );
}

/// The bits Rabenseifner must produce, from the order stated in
/// `algo/mod.rs`: fold 2i and 2i+1 for i < n − p, then pair virtual ranks
/// v, v + p/2 first, … v, v + 1 last, always lower ⊕ upper.
fn rabenseifner_reference(x: &[Vec<f32>]) -> Vec<f32> {
    let n = x.len();
    let p = 1usize << (usize::BITS - 1 - n.leading_zeros());
    let extra = n - p;
    let mut level: Vec<Vec<f32>> = (0..p)
        .map(|v| {
            if v < extra {
                x[2 * v]
                    .iter()
                    .zip(&x[2 * v + 1])
                    .map(|(a, b)| a + b)
                    .collect()
            } else {
                x[v + extra].clone()
            }
        })
        .collect();
    let mut half = p / 2;
    while half > 0 {
        level = (0..half)
            .map(|v| {
                level[v]
                    .iter()
                    .zip(&level[v + half])
                    .map(|(a, b)| a + b)
                    .collect()
            })
            .collect();
        half /= 2;
    }
    level.swap_remove(0)
}

#[test]
fn rabenseifner_follows_its_stated_order() {
    for n in [2, 3, 5, 6, 7, 8] {
        let input = |r: usize| -> Vec<f32> {
            (0..1001)
                .map(|i| ((i * 2654435761u64 as usize + r * 97) % 100_003) as f32 / 7.3e3 - 6.0)
                .collect()
        };
        let res = run(Fabric::Local, n, cfg(), |c| {
            let mut c = c.split(0, 0)?;
            c.set_algorithms(Algorithms {
                allreduce: AllreduceAlgo::Rabenseifner,
                ..Default::default()
            });
            let mut a = input(c.rank());
            c.allreduce_in_place(&mut a, ferroce_collectives::ReduceOp::Sum)?;
            Ok(a)
        })
        .unwrap();
        let want = rabenseifner_reference(&(0..n).map(input).collect::<Vec<_>>());
        for (r, got) in res.into_iter().enumerate() {
            let got = got.unwrap();
            let same = got
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "{n} ranks, rank {r}: bits differ from the stated order"
            );
        }
    }
}

#[test]
fn auto_picks_by_size_and_rank_count() {
    let res = run(Fabric::Local, 6, cfg(), |c| {
        let a = Algorithms::default();
        Ok([
            c.allreduce_algo_for(8, 2),
            c.allreduce_algo_for(a.small_bytes + 4, (a.small_bytes + 4) / 4),
            c.allreduce_algo_for(a.ring_bytes, a.ring_bytes / 4),
            c.split((c.rank() / 4) as u32, 0)?
                .allreduce_algo_for(64 << 20, 16 << 20),
        ])
    })
    .unwrap();
    let got = res[0].as_ref().unwrap();
    use AllreduceAlgo::*;
    assert_eq!(got[..3], [RecursiveDoubling, Rabenseifner, Ring]);
    // Ranks 0..4 form a power-of-two communicator: Rabenseifner at any size.
    assert_eq!(got[3], Rabenseifner);
}

#[test]
fn split_groups_by_color_and_key() {
    let res = run(Fabric::Local, 7, cfg(), |c| {
        let r = c.rank();
        // Colours: even/odd; key reverses the order.
        let sub = c.split((r % 2) as u32, -(r as i32))?;
        let mut x = [r as i64];
        sub.allreduce_in_place(&mut x, ferroce_collectives::ReduceOp::Sum)?;
        let mut first = [r as i64];
        sub.broadcast(&mut first, 0)?;
        Ok((sub.rank(), sub.size(), x[0], first[0]))
    })
    .unwrap();
    for (r, x) in res.into_iter().enumerate() {
        let (sr, ss, sum, first) = x.unwrap();
        if r % 2 == 0 {
            assert_eq!((ss, sum, first), (4, 12, 6));
            assert_eq!(sr, (6 - r) / 2);
        } else {
            assert_eq!((ss, sum, first), (3, 9, 5));
            assert_eq!(sr, (5 - r) / 2);
        }
    }
}

/// In place and out of place too: the out-of-place ring and (on 4 ranks)
/// Rabenseifner fold `send` in where the in-place ones read the buffer.
#[test]
fn floats_are_deterministic_and_equal_on_every_rank() {
    for (algo, n) in [
        (AllreduceAlgo::Ring, 7),
        (AllreduceAlgo::Ring, 4),
        (AllreduceAlgo::RecursiveDoubling, 7),
        (AllreduceAlgo::Rabenseifner, 7),
        (AllreduceAlgo::Rabenseifner, 4),
    ] {
        let res = run(Fabric::Local, n, cfg(), |c| {
            let mut c = c.split(0, 0)?;
            c.set_algorithms(Algorithms {
                allreduce: algo,
                ..Default::default()
            });
            // Values with many significant bits: order matters here.
            let x: Vec<f32> = (0..1001)
                .map(|i| ((i * 2654435761u64 as usize + c.rank() * 97) % 100_003) as f32 / 7.3e3)
                .collect();
            let mut a = x.clone();
            c.allreduce_in_place(&mut a, ferroce_collectives::ReduceOp::Sum)?;
            // Out of place, into a buffer holding something else.
            let mut b = vec![f32::NAN; x.len()];
            c.allreduce(&x, &mut b, ferroce_collectives::ReduceOp::Sum)?;
            Ok((a, b))
        })
        .unwrap();
        let (a0, _) = res[0].as_ref().unwrap().clone();
        for x in &res {
            let (a, b) = x.as_ref().unwrap();
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(a),
                bits(b),
                "{algo:?}, {n} ranks: in and out of place differ"
            );
            assert_eq!(a, &a0, "{algo:?}, {n} ranks: ranks disagree");
        }
    }
}

#[test]
fn a_dead_peer_is_an_error_not_a_hang() {
    let t0 = std::time::Instant::now();
    let res = run(
        Fabric::Local,
        3,
        RdmaConfig {
            timeout: std::time::Duration::from_secs(1),
            ..Default::default()
        },
        |c| {
            if c.rank() == 2 {
                return Ok(());
            }
            let mut x = [1.0f32; 100];
            c.allreduce_in_place(&mut x, ferroce_collectives::ReduceOp::Sum)
        },
    )
    .unwrap();
    assert!(res[0].is_err() && res[1].is_err(), "{res:?}");
    assert!(t0.elapsed() < std::time::Duration::from_secs(10));
}
