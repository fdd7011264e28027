//! Element types and reduction operators.
//!
//! Every reduction is written as `combine(lower, upper)`, where `lower` holds
//! the contribution of the lower-ordered rank(s) in the algorithm's fixed
//! order; the algorithms document that order, so a float result depends only
//! on (algorithm, size, ranks) and never on timing. Half-precision types are
//! combined in f32 and rounded once per step.

use half::{bf16, f16};

/// An element type of a collective (the `ncclDataType_t` of ferroce).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F64,
    F16,
    Bf16,
    I8,
    U8,
    I32,
    I64,
    U64,
}

impl DType {
    pub const ALL: [DType; 9] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::Bf16,
        DType::I8,
        DType::U8,
        DType::I32,
        DType::I64,
        DType::U64,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::I8 | DType::U8 => 1,
            DType::F16 | DType::Bf16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 | DType::U64 => 8,
        }
    }

    /// The name nccl-tests prints.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float",
            DType::F64 => "double",
            DType::F16 => "half",
            DType::Bf16 => "bfloat16",
            DType::I8 => "int8",
            DType::U8 => "uint8",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::U64 => "uint64",
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::Bf16)
    }

    /// Parse a name as nccl-tests' `-d` takes it (plus short aliases).
    pub fn parse(s: &str) -> Option<DType> {
        Some(match s {
            "float" | "f32" | "float32" => DType::F32,
            "double" | "f64" | "float64" => DType::F64,
            "half" | "f16" | "float16" => DType::F16,
            "bfloat16" | "bf16" => DType::Bf16,
            "int8" | "i8" => DType::I8,
            "uint8" | "u8" => DType::U8,
            "int32" | "i32" | "int" => DType::I32,
            "int64" | "i64" => DType::I64,
            "uint64" | "u64" => DType::U64,
            _ => return None,
        })
    }
}

/// A reduction operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Prod,
    Min,
    Max,
    /// Sum, then divided by the number of ranks once at the end (integer
    /// types: wrapping sum, then division truncating toward zero).
    Avg,
}

impl ReduceOp {
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ];
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
        }
    }
    pub fn parse(s: &str) -> Option<ReduceOp> {
        Some(match s {
            "sum" => ReduceOp::Sum,
            "prod" => ReduceOp::Prod,
            "min" => ReduceOp::Min,
            "max" => ReduceOp::Max,
            "avg" => ReduceOp::Avg,
            _ => return None,
        })
    }
}

/// A type collectives can move and reduce.
pub trait Element:
    bytemuck::Pod + Copy + Send + Sync + PartialEq + PartialOrd + std::fmt::Debug + 'static
{
    const DTYPE: DType;
    /// `lower op upper` (Avg combines as Sum).
    fn combine(op: ReduceOp, lower: Self, upper: Self) -> Self;
    /// Divide by the rank count (the last step of Avg).
    fn div_count(self, n: usize) -> Self;
    /// A value from a small integer (test data, bench data).
    fn from_i64(v: i64) -> Self;
    /// The value as f64 (checks).
    fn to_f64(self) -> f64;
}

macro_rules! float_element {
    ($t:ty, $d:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            #[inline]
            fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => a + b,
                    ReduceOp::Prod => a * b,
                    ReduceOp::Min => {
                        if b < a {
                            b
                        } else {
                            a
                        }
                    }
                    ReduceOp::Max => {
                        if b > a {
                            b
                        } else {
                            a
                        }
                    }
                }
            }
            fn div_count(self, n: usize) -> Self {
                self / (n as $t)
            }
            fn from_i64(v: i64) -> Self {
                v as $t
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
        }
    };
}
float_element!(f32, DType::F32);
float_element!(f64, DType::F64);

macro_rules! half_element {
    ($t:ty, $d:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            #[inline]
            fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
                let (x, y) = (a.to_f32(), b.to_f32());
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => <$t>::from_f32(x + y),
                    ReduceOp::Prod => <$t>::from_f32(x * y),
                    ReduceOp::Min => {
                        if y < x {
                            b
                        } else {
                            a
                        }
                    }
                    ReduceOp::Max => {
                        if y > x {
                            b
                        } else {
                            a
                        }
                    }
                }
            }
            fn div_count(self, n: usize) -> Self {
                <$t>::from_f32(self.to_f32() / n as f32)
            }
            fn from_i64(v: i64) -> Self {
                <$t>::from_f32(v as f32)
            }
            fn to_f64(self) -> f64 {
                self.to_f64()
            }
        }
    };
}
half_element!(f16, DType::F16);
half_element!(bf16, DType::Bf16);

macro_rules! int_element {
    ($t:ty, $d:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            #[inline]
            fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => a.wrapping_add(b),
                    ReduceOp::Prod => a.wrapping_mul(b),
                    ReduceOp::Min => a.min(b),
                    ReduceOp::Max => a.max(b),
                }
            }
            fn div_count(self, n: usize) -> Self {
                // n ≤ 2^31 ranks always fits the dividend's type except for
                // i8/u8 with ≥ 128 ranks, where the quotient is 0 anyway.
                match <$t>::try_from(n) {
                    Ok(d) if d != 0 => self.wrapping_div(d),
                    _ => 0,
                }
            }
            fn from_i64(v: i64) -> Self {
                v as $t
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
        }
    };
}
int_element!(i8, DType::I8);
int_element!(u8, DType::U8);
int_element!(i32, DType::I32);
int_element!(i64, DType::I64);
int_element!(u64, DType::U64);

/// `acc[i] = acc[i] op other[i]` — `acc` is the lower contribution.
pub fn reduce_lower<T: Element>(op: ReduceOp, acc: &mut [T], other: &[T]) {
    for (a, b) in acc.iter_mut().zip(other) {
        *a = T::combine(op, *a, *b);
    }
}

/// `acc[i] = other[i] op acc[i]` — `other` is the lower contribution.
pub fn reduce_upper<T: Element>(op: ReduceOp, acc: &mut [T], other: &[T]) {
    for (a, b) in acc.iter_mut().zip(other) {
        *a = T::combine(op, *b, *a);
    }
}

/// `dst[i] = lower[i] op upper[i]` (for a fold that also reads the local
/// operand from elsewhere: one pass instead of a copy and a fold).
pub fn reduce_into<T: Element>(op: ReduceOp, dst: &mut [T], lower: &[T], upper: &[T]) {
    for ((d, a), b) in dst.iter_mut().zip(lower).zip(upper) {
        *d = T::combine(op, *a, *b);
    }
}

/// The last step of Avg: divide every element by `n` (no-op for other ops).
pub fn finish<T: Element>(op: ReduceOp, buf: &mut [T], n: usize) {
    if op == ReduceOp::Avg {
        for x in buf.iter_mut() {
            *x = x.div_count(n);
        }
    }
}

/// Call `$body` with `$T` bound to the Rust type of a [`DType`] value.
#[macro_export]
macro_rules! with_dtype {
    ($dt:expr, $T:ident => $body:expr) => {
        match $dt {
            $crate::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::DType::F64 => {
                type $T = f64;
                $body
            }
            $crate::DType::F16 => {
                type $T = $crate::half::f16;
                $body
            }
            $crate::DType::Bf16 => {
                type $T = $crate::half::bf16;
                $body
            }
            $crate::DType::I8 => {
                type $T = i8;
                $body
            }
            $crate::DType::U8 => {
                type $T = u8;
                $body
            }
            $crate::DType::I32 => {
                type $T = i32;
                $body
            }
            $crate::DType::I64 => {
                type $T = i64;
                $body
            }
            $crate::DType::U64 => {
                type $T = u64;
                $body
            }
        }
    };
}
