//! Arithmetic and math on signals after Pd 0.53's d_arithmetic.c and d_math.c:
//! `+~ -~ *~ /~ max~ min~` (with an argument the right inlet is a control float, without
//! it a signal), `clip~`, `wrap~`, `abs~`, `sqrt~` (Pd's table-driven reciprocal square root),
//! `mtof~`, and `sig~`.

use super::{farg, has_float_arg, Cx, PdObject, Port};
use crate::atom::{Atom, Msg};
use std::sync::OnceLock;

/// The binary operators.
#[derive(Debug, Clone, Copy)]
enum Op {
    Plus,
    Minus,
    Times,
    Over,
    Max,
    Min,
}

/// `+~` and friends.
#[derive(Debug)]
pub struct Binop {
    op: Op,
    /// Right inlet is a control float (an argument was given).
    scalar_right: bool,
    left: f32,
    right: f32,
}

impl PdObject for Binop {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        let r = if self.scalar_right {
            Port::Control
        } else {
            Port::Signal
        };
        (vec![Port::Signal, r], vec![Port::Signal])
    }
    fn message(&mut self, inlet: usize, msg: &Msg, _cx: &mut Cx<'_>) {
        if msg.selector == "float" {
            match inlet {
                0 => self.left = msg.f(0),
                _ => self.right = msg.f(0),
            }
        }
    }
    fn is_dsp(&self) -> bool {
        true
    }
    fn signal_scalar(&self, inlet: usize) -> f32 {
        if inlet == 0 {
            self.left
        } else {
            self.right
        }
    }
    fn perform(&mut self, ins: &[&[f32]], outs: &mut [&mut [f32]]) {
        let out = &mut outs[0];
        let a = ins[0];
        if self.scalar_right {
            let g = self.right;
            match self.op {
                Op::Plus => out.iter_mut().zip(a).for_each(|(o, &f)| *o = f + g),
                Op::Minus => out.iter_mut().zip(a).for_each(|(o, &f)| *o = f - g),
                Op::Times => out.iter_mut().zip(a).for_each(|(o, &f)| *o = f * g),
                Op::Over => {
                    let inv = if g != 0.0 {
                        (1.0f64 / g as f64) as f32
                    } else {
                        0.0
                    };
                    out.iter_mut().zip(a).for_each(|(o, &f)| *o = f * inv)
                }
                Op::Max => out
                    .iter_mut()
                    .zip(a)
                    .for_each(|(o, &f)| *o = if f > g { f } else { g }),
                Op::Min => out
                    .iter_mut()
                    .zip(a)
                    .for_each(|(o, &f)| *o = if f < g { f } else { g }),
            }
        } else {
            let b = ins[1];
            let it = out.iter_mut().zip(a.iter().zip(b));
            match self.op {
                Op::Plus => it.for_each(|(o, (&f, &g))| *o = f + g),
                Op::Minus => it.for_each(|(o, (&f, &g))| *o = f - g),
                Op::Times => it.for_each(|(o, (&f, &g))| *o = f * g),
                Op::Over => it.for_each(|(o, (&f, &g))| *o = if g != 0.0 { f / g } else { 0.0 }),
                Op::Max => it.for_each(|(o, (&f, &g))| *o = if f > g { f } else { g }),
                Op::Min => it.for_each(|(o, (&f, &g))| *o = if f < g { f } else { g }),
            }
        }
    }
    fn cost_hint_ns(&self) -> u32 {
        40
    }
}

/// The unary functions.
#[derive(Debug, Clone, Copy)]
enum Fun {
    Wrap,
    Abs,
    Sqrt,
    Mtof,
}

/// `wrap~`, `abs~`, `sqrt~`, `mtof~`.
#[derive(Debug)]
pub struct Unary {
    fun: Fun,
    scalar: f32,
}

/// Pd's reciprocal-square-root tables (d_math.c `init_rsqrt`).
fn rsqrt_tables() -> &'static (Vec<f32>, Vec<f32>) {
    static T: OnceLock<(Vec<f32>, Vec<f32>)> = OnceLock::new();
    T.get_or_init(|| {
        let exp = (0..256)
            .map(|i: i32| {
                let l = (if i == 0 {
                    1
                } else if i == 255 {
                    254
                } else {
                    i
                }) << 23;
                let f = f32::from_bits(l as u32);
                (1.0 / (f as f64).sqrt()) as f32
            })
            .collect();
        let mant = (0..1024)
            .map(|i| {
                let f = (1.0 + (1.0f64 / 1024.0) * i as f64) as f32;
                (1.0 / (f as f64).sqrt()) as f32
            })
            .collect();
        (exp, mant)
    })
}

/// Pd's `sqrt~` for one sample.
fn pd_sqrt(f: f32) -> f32 {
    if f < 0.0 {
        return 0.0;
    }
    let (exp, mant) = rsqrt_tables();
    let l = f.to_bits();
    let g = exp[((l >> 23) & 0xff) as usize] * mant[((l >> 13) & 0x3ff) as usize];
    let (g, fd) = (g as f64, f as f64);
    (fd * (1.5 * g - 0.5 * g * g * g * fd)) as f32
}

/// Pd's `mtof` (x_acoustics.c), also used by `mtof~`.
pub fn mtof(f: f32) -> f32 {
    if f <= -1500.0 {
        0.0
    } else {
        let f = if f > 1499.0 { 1499.0 } else { f };
        (8.17579891564 * (0.0577622650 * f as f64).exp()) as f32
    }
}

impl PdObject for Unary {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Signal], vec![Port::Signal])
    }
    fn message(&mut self, _inlet: usize, msg: &Msg, _cx: &mut Cx<'_>) {
        if msg.selector == "float" {
            self.scalar = msg.f(0);
        }
    }
    fn is_dsp(&self) -> bool {
        true
    }
    fn signal_scalar(&self, _: usize) -> f32 {
        self.scalar
    }
    fn perform(&mut self, ins: &[&[f32]], outs: &mut [&mut [f32]]) {
        let it = outs[0].iter_mut().zip(ins[0].iter());
        match self.fun {
            Fun::Wrap => it.for_each(|(o, &f)| {
                let f = if f > i32::MAX as f32 || f < i32::MIN as f32 {
                    0.0
                } else {
                    f
                };
                let k = f as i32;
                *o = if (k as f32) <= f {
                    f - k as f32
                } else {
                    f - (k - 1) as f32
                };
            }),
            Fun::Abs => it.for_each(|(o, &f)| *o = if f >= 0.0 { f } else { -f }),
            Fun::Sqrt => it.for_each(|(o, &f)| *o = pd_sqrt(f)),
            Fun::Mtof => it.for_each(|(o, &f)| *o = mtof(f)),
        }
    }
}

/// `clip~ lo hi`.
#[derive(Debug)]
pub struct Clip {
    lo: f32,
    hi: f32,
    scalar: f32,
}

impl PdObject for Clip {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (
            vec![Port::Signal, Port::Control, Port::Control],
            vec![Port::Signal],
        )
    }
    fn message(&mut self, inlet: usize, msg: &Msg, _cx: &mut Cx<'_>) {
        if msg.selector == "float" {
            match inlet {
                0 => self.scalar = msg.f(0),
                1 => self.lo = msg.f(0),
                _ => self.hi = msg.f(0),
            }
        }
    }
    fn is_dsp(&self) -> bool {
        true
    }
    fn signal_scalar(&self, _: usize) -> f32 {
        self.scalar
    }
    fn perform(&mut self, ins: &[&[f32]], outs: &mut [&mut [f32]]) {
        for (o, &f) in outs[0].iter_mut().zip(ins[0].iter()) {
            let mut f = f;
            if f < self.lo {
                f = self.lo;
            }
            if f > self.hi {
                f = self.hi;
            }
            *o = f;
        }
    }
}

/// `sig~`: a float as a signal.
#[derive(Debug)]
pub struct Sig {
    value: f32,
}

impl PdObject for Sig {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Control], vec![Port::Signal])
    }
    fn message(&mut self, _inlet: usize, msg: &Msg, _cx: &mut Cx<'_>) {
        if msg.selector == "float" {
            self.value = msg.f(0);
        }
    }
    fn is_dsp(&self) -> bool {
        true
    }
    fn perform(&mut self, _ins: &[&[f32]], outs: &mut [&mut [f32]]) {
        outs[0].fill(self.value);
    }
    fn cost_hint_ns(&self) -> u32 {
        20
    }
}

/// Creates the d_arithmetic.c / d_math.c objects.
pub fn create(class: &str, args: &[Atom]) -> Option<Box<dyn PdObject>> {
    let op = match class {
        "+~" => Some(Op::Plus),
        "-~" => Some(Op::Minus),
        "*~" => Some(Op::Times),
        "/~" => Some(Op::Over),
        "max~" => Some(Op::Max),
        "min~" => Some(Op::Min),
        _ => None,
    };
    if let Some(op) = op {
        return Some(Box::new(Binop {
            op,
            scalar_right: has_float_arg(args),
            left: 0.0,
            right: farg(args, 0, 0.0),
        }));
    }
    let fun = match class {
        "wrap~" => Fun::Wrap,
        "abs~" => Fun::Abs,
        "sqrt~" => Fun::Sqrt,
        "mtof~" => Fun::Mtof,
        "clip~" => {
            return Some(Box::new(Clip {
                lo: farg(args, 0, 0.0),
                hi: farg(args, 1, 0.0),
                scalar: 0.0,
            }))
        }
        "sig~" => {
            return Some(Box::new(Sig {
                value: farg(args, 0, 0.0),
            }))
        }
        _ => return None,
    };
    Some(Box::new(Unary { fun, scalar: 0.0 }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqrt_is_close_to_the_real_one() {
        for x in [0.25f32, 2.0, 9.0, 1000.0] {
            assert!((pd_sqrt(x) - x.sqrt()).abs() < 1e-3 * x.sqrt(), "{x}");
        }
        assert_eq!(pd_sqrt(-1.0), 0.0);
    }

    #[test]
    fn mtof_a440() {
        assert!((mtof(69.0) - 440.0).abs() < 1e-3);
    }
}
