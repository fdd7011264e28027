//! Collective algorithms and their reduction orders.
//!
//! Every float result is a fixed function of (algorithm, element count,
//! rank count, root): the order in which contributions are combined never
//! depends on timing. The orders, with `⊕` the operator and `x_i` rank i's
//! input:
//!
//! - **ring** (allreduce, reduce_scatter): the vector is cut into n blocks
//!   (the first `count % n` one element longer). Block b is folded left to
//!   right over ranks b+1, b+2, …, n−1, 0, …, b: `((x_{b+1} ⊕ x_{b+2}) ⊕ …) ⊕ x_b`,
//!   finished at rank b and then copied bit for bit to every rank.
//! - **recursive doubling** (allreduce): a balanced tree over ranks in
//!   order. With p the largest power of two ≤ n and e = n − p, ranks 2i and
//!   2i+1 (i < e) first form `x_{2i} ⊕ x_{2i+1}`; the p resulting leaves are
//!   combined pairwise, always `lower ⊕ upper`, level by level. Every rank
//!   computes the same tree, so every rank gets the same bits.
//! - **Rabenseifner** (allreduce): the extra ranks fold as in recursive
//!   doubling; then, over the p virtual ranks, block b is combined over a
//!   balanced tree whose first level pairs virtual ranks v and v + p/2, the
//!   next v and v + p/4, …, the last v and v + 1 (bits from the highest
//!   down), always `lower ⊕ upper`; finished at its owner and copied bit for
//!   bit to every rank.
//! - **binomial reduce**: with v = (rank − root) mod n, the tree folds the
//!   block of relative ranks [v, v+2^k) as `[v, v+2^(k−1)) ⊕ [v+2^(k−1), v+2^k)`.
//! - **chain reduce**: relative ranks fold from the far end:
//!   `x_{v0} ⊕ (x_{v1} ⊕ (… ⊕ x_{v(n−1)}))`, per segment.
//! - Avg divides the final sum by n once.

mod fold;
pub mod halving_doubling;
pub mod rabenseifner;
pub mod ring;
pub mod tree;
