//! Unit tests of the com.microsoft QOperator kernels.

use alloc::vec;
use alloc::vec::Vec;

use crate::model::{AttrValue, Const};
use crate::ops::testing::{run_in, t, vals};

const MS: &str = "com.microsoft";

fn s(v: f32) -> Option<Const> {
    t(&[], &[v])
}

#[test]
fn add_broadcasts_and_rounds_half_even() {
    // a: scale 0.5 zp 10; b: scale 0.25 zp 0; c: scale 0.5 zp 1.
    let a = t(&[2, 2], &[10u8, 12, 14, 16]);
    let b = t(&[2], &[0u8, 2]);
    let ins = vec![
        a,
        s(0.5),
        t(&[], &[10u8]),
        b,
        s(0.25),
        t(&[], &[0u8]),
        s(0.5),
        t(&[], &[1u8]),
    ];
    let y = run_in(MS, "QLinearAdd", 1, vec![], &ins, 1).unwrap();
    // real a = [0,1,2,3], b = [0,0.5] -> [0,1.5,2,3.5] / 0.5 = [0,3,4,7] + 1
    assert_eq!(vals::<u8>(&y[0]), vec![1, 4, 5, 8]);
}

#[test]
fn mul_int8() {
    let ins = vec![
        t(&[3], &[-4i8, 2, 100]),
        s(0.5),
        t(&[], &[0i8]),
        t(&[], &[3i8]),
        s(1.0),
        t(&[], &[0i8]),
        s(1.0),
        t(&[], &[0i8]),
    ];
    let y = run_in(MS, "QLinearMul", 1, vec![], &ins, 1).unwrap();
    assert_eq!(vals::<i8>(&y[0]), vec![-6, 3, 127]);
}

#[test]
fn bad_inputs_are_errors() {
    // zero point of the wrong dtype
    let ins = vec![
        t(&[2], &[1u8, 2]),
        s(0.5),
        t(&[], &[0i8]),
        t(&[2], &[1u8, 2]),
        s(0.5),
        None,
        s(1.0),
        None,
    ];
    assert!(run_in(MS, "QLinearAdd", 1, vec![], &ins, 1).is_err());
    // shapes that do not broadcast
    let ins = vec![
        t(&[3], &[1u8, 2, 3]),
        s(0.5),
        None,
        t(&[2], &[1u8, 2]),
        s(0.5),
        None,
        s(1.0),
        None,
    ];
    assert!(run_in(MS, "QLinearAdd", 1, vec![], &ins, 1).is_err());
    // non-positive scale
    let ins = vec![t(&[2], &[1u8, 2]), s(0.0), None, s(1.0), None];
    assert!(run_in(MS, "QLinearSigmoid", 1, vec![], &ins, 1).is_err());
    // QGemm K mismatch
    let ins = vec![
        t(&[2, 3], &[0u8; 6]),
        s(1.0),
        None,
        t(&[2, 2], &[0u8; 4]),
        s(1.0),
        None,
    ];
    assert!(run_in(MS, "QGemm", 1, vec![], &ins, 1).is_err());
    // QLinearConcat with a dangling input
    let ins = vec![s(1.0), t(&[], &[0u8]), t(&[1], &[1u8]), s(1.0)];
    assert!(run_in(
        MS,
        "QLinearConcat",
        1,
        vec![("axis", AttrValue::Int(0))],
        &ins,
        1
    )
    .is_err());
}

#[test]
fn leaky_relu_table_and_pools() {
    let x: Vec<i8> = vec![-10, 0, 10];
    let ins = vec![t(&[3], &x), s(0.1), t(&[], &[0i8]), s(0.1), t(&[], &[0i8])];
    let y = run_in(
        MS,
        "QLinearLeakyRelu",
        1,
        vec![("alpha", AttrValue::Float(0.5))],
        &ins,
        1,
    )
    .unwrap();
    assert_eq!(vals::<i8>(&y[0]), vec![-5, 0, 10]);
    // global average: mean of 1..=4 = 2.5 -> 2 (half to even)
    let ins = vec![
        t(&[1, 1, 2, 2], &[1u8, 2, 3, 4]),
        s(1.0),
        None,
        s(1.0),
        None,
    ];
    let y = run_in(MS, "QLinearGlobalAveragePool", 1, vec![], &ins, 1).unwrap();
    assert_eq!(vals::<u8>(&y[0]), vec![2]);
    assert_eq!(y[0].shape, vec![1, 1, 1, 1]);
    // 2x2 window, pad 1, count_include_pad: corner = 1 / 4 -> 0; without: 1
    let attrs = |inc: i64| {
        vec![
            ("kernel_shape", AttrValue::Ints(vec![2, 2])),
            ("pads", AttrValue::Ints(vec![1, 1, 1, 1])),
            ("strides", AttrValue::Ints(vec![2, 2])),
            ("count_include_pad", AttrValue::Int(inc)),
        ]
    };
    let ins = vec![
        t(&[1, 1, 2, 2], &[4u8, 4, 4, 4]),
        s(1.0),
        None,
        s(1.0),
        None,
    ];
    let y = run_in(MS, "QLinearAveragePool", 1, attrs(1), &ins, 1).unwrap();
    assert_eq!(vals::<u8>(&y[0]), vec![1, 1, 1, 1]);
    let y = run_in(MS, "QLinearAveragePool", 1, attrs(0), &ins, 1).unwrap();
    assert_eq!(vals::<u8>(&y[0]), vec![4, 4, 4, 4]);
}

#[test]
fn qgemm_bias_and_float_output() {
    // A [1,2] = [1,2], B [2,1] = [3,4], C = [5]: acc = 11 + 5 = 16.
    let base = vec![
        t(&[1, 2], &[1u8, 2]),
        s(0.5),
        None,
        t(&[2, 1], &[3u8, 4]),
        s(0.25),
        None,
        t(&[1], &[5i32]),
    ];
    let y = run_in(MS, "QGemm", 1, vec![], &base, 1).unwrap();
    assert_eq!(vals::<f32>(&y[0]), vec![2.0]);
    let mut q = base.clone();
    q.push(s(0.5));
    q.push(t(&[], &[3u8]));
    let y = run_in(MS, "QGemm", 1, vec![], &q, 1).unwrap();
    assert_eq!(vals::<u8>(&y[0]), vec![7]);
}
