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

#[test]
fn floats_are_deterministic_and_equal_on_every_rank() {
    for algo in [AllreduceAlgo::Ring, AllreduceAlgo::RecursiveDoubling] {
        let res = run(Fabric::Local, 7, cfg(), |c| {
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
            let mut b = x;
            c.allreduce_in_place(&mut b, ferroce_collectives::ReduceOp::Sum)?;
            Ok((a, b))
        })
        .unwrap();
        let (a0, _) = res[0].as_ref().unwrap().clone();
        for x in &res {
            let (a, b) = x.as_ref().unwrap();
            assert_eq!(a, b, "{algo:?}: same inputs, different bits");
            assert_eq!(a, &a0, "{algo:?}: ranks disagree");
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
