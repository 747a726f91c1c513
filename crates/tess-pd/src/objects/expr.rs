//! `expr~` and `expr` after Pd 0.53's x_vexp.c, x_vexp_fun.c and x_vexp_if.c (Yadegari's
//! expression evaluator).
//!
//! The box's arguments are joined into one text (Pd hands the object its atoms; the commas and
//! semicolons a file writes as `\,` and `\;` come as separators) and parsed with C's operators
//! and precedence. `$v1`.. are signal inlets (`expr~` only), `$f1`/`$i1`.. float inlets; the
//! first inlet of `expr~` is always a signal. Expressions separated by `;` get one outlet each.
//!
//! Pd's types are kept, because they change results: a literal without a point is an integer,
//! and integer by integer stays integer (`1/2` is 0, as in Pd; `1/2.` is 0.5). A float
//! operand makes the operation float (`t_float`, 32-bit); a signal operand makes it a vector of
//! floats, element by element. `/` and `%` by zero give 0 (Pd posts "divide by zero
//! detected"); `%`, the shifts, `& | ^ && ||` and `~` work on the operands truncated to
//! integers. Functions compute in double through the C library and round to float, as Pd's
//! do. `if(c, a, b)` picks per sample for signals.
//!
//! Tables: `name[i]` reads array `name`, `$sN[i]` the array whose name was last sent to inlet
//! N as a symbol; the index is truncated and clamped into the array, and a missing array
//! reads 0 (Pd posts "no such table"). A signal index reads 0 too, as in Pd 0.53, which
//! refuses it ("bad argument for table"; `tabread~` reads an array at signal rate).
//!
//! Not supported, each a clear error at creation: the assignment operator `=`, `random` (Pd's own generator), `$x` and `$y` (those belong to
//! `fexpr~`, a different object).

use super::{CreateError, Cx, DspEnv, PdObject, Port};
use crate::atom::{Atom, Msg};
use crate::shared::Shared;
use std::sync::{Arc, RwLock};

type Array = Arc<RwLock<Vec<f32>>>;

/// A scalar value with Pd's type.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Sc {
    Int(i64),
    Flt(f32),
}

impl Sc {
    fn f(self) -> f32 {
        match self {
            Sc::Int(i) => i as f32,
            Sc::Flt(f) => f,
        }
    }
    fn d(self) -> f64 {
        match self {
            Sc::Int(i) => i as f64,
            Sc::Flt(f) => f as f64,
        }
    }
    fn truthy(self) -> bool {
        match self {
            Sc::Int(i) => i != 0,
            Sc::Flt(f) => f != 0.0,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bin {
    Mul,
    Div,
    Mod,
    Add,
    Sub,
    Shl,
    Shr,
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
    And,
    Xor,
    Or,
    LAnd,
    LOr,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Un {
    Neg,
    Not,
    Compl,
}

/// The functions of x_vexp_fun.c that are supported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fun {
    Min,
    Max,
    Int,
    Rint,
    Float,
    Fmod,
    Floor,
    Ceil,
    Pow,
    Sqrt,
    Exp,
    Log10,
    Ln,
    Sin,
    Cos,
    Tan,
    Asin,
    Acos,
    Atan,
    Atan2,
    Sinh,
    Cosh,
    Tanh,
    Abs,
    If,
}

fn function(name: &str) -> Option<(Fun, usize)> {
    Some(match name {
        "min" => (Fun::Min, 2),
        "max" => (Fun::Max, 2),
        "int" => (Fun::Int, 1),
        "rint" => (Fun::Rint, 1),
        "float" => (Fun::Float, 1),
        "fmod" => (Fun::Fmod, 2),
        "floor" => (Fun::Floor, 1),
        "ceil" => (Fun::Ceil, 1),
        "pow" => (Fun::Pow, 2),
        "sqrt" => (Fun::Sqrt, 1),
        "exp" => (Fun::Exp, 1),
        "log10" => (Fun::Log10, 1),
        "ln" | "log" => (Fun::Ln, 1),
        "sin" => (Fun::Sin, 1),
        "cos" => (Fun::Cos, 1),
        "tan" => (Fun::Tan, 1),
        "asin" => (Fun::Asin, 1),
        "acos" => (Fun::Acos, 1),
        "atan" => (Fun::Atan, 1),
        "atan2" => (Fun::Atan2, 2),
        "sinh" => (Fun::Sinh, 1),
        "cosh" => (Fun::Cosh, 1),
        "tanh" => (Fun::Tanh, 1),
        "abs" => (Fun::Abs, 1),
        "if" => (Fun::If, 3),
        _ => return None,
    })
}

/// A node of the parsed expression. Children always sit before their parent in the arena
/// (see [`Program`]).
#[derive(Debug, Clone, PartialEq)]
enum Node {
    Const(Sc),
    /// Signal inlet (0-based).
    Sig(usize),
    /// Float inlet (0-based); `int`: `$i`, truncated.
    Ctl(usize, bool),
    Unary(Un, usize),
    Binary(Bin, usize, usize),
    Call(Fun, Vec<usize>),
    /// Read of table slot `.0` ([`Program::tables`]) at the index node `.1`.
    Table(usize, usize),
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Num(Sc),
    Var(char, usize),
    Ident(String),
    Op(&'static str),
    /// `name[` or `$sN[`: a table read, its index follows up to `]`.
    Table(TableName),
}

/// The table a read names: fixed in the text, or the symbol last sent to an inlet (`$sN`).
#[derive(Debug, Clone, PartialEq)]
enum TableName {
    Named(String),
    Inlet(usize),
}

const OPS: [&str; 25] = [
    "<<", ">>", "<=", ">=", "==", "!=", "&&", "||", "+", "-", "*", "/", "%", "<", ">", "&", "^",
    "|", "!", "~", "(", ")", ",", "=", "]",
];

/// Skips spaces from `i`; whether `[` comes next (then past it).
fn opens_index(b: &[u8], i: &mut usize) -> bool {
    let mut j = *i;
    while j < b.len() && b[j].is_ascii_whitespace() {
        j += 1;
    }
    if b.get(j) == Some(&b'[') {
        *i = j + 1;
        true
    } else {
        false
    }
}

fn lex(text: &str) -> Result<Vec<Tok>, String> {
    let b = text.as_bytes();
    let mut i = 0;
    let mut out = Vec::new();
    while i < b.len() {
        let c = b[i] as char;
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_digit() || (c == '.' && b.get(i + 1).is_some_and(u8::is_ascii_digit)) {
            let start = i;
            let mut float = false;
            while i < b.len() && (b[i].is_ascii_digit() || b[i] == b'.') {
                float |= b[i] == b'.';
                i += 1;
            }
            if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
                let mut j = i + 1;
                if j < b.len() && (b[j] == b'+' || b[j] == b'-') {
                    j += 1;
                }
                if j < b.len() && b[j].is_ascii_digit() {
                    float = true;
                    i = j;
                    while i < b.len() && b[i].is_ascii_digit() {
                        i += 1;
                    }
                }
            }
            let s = &text[start..i];
            out.push(Tok::Num(if float {
                Sc::Flt(s.parse::<f32>().map_err(|_| format!("bad number '{s}'"))?)
            } else {
                Sc::Int(s.parse::<i64>().map_err(|_| format!("bad number '{s}'"))?)
            }));
        } else if c == '$' {
            let kind = b.get(i + 1).map(|&k| (k as char).to_ascii_lowercase());
            let start = i + 2;
            let mut j = start;
            while j < b.len() && b[j].is_ascii_digit() {
                j += 1;
            }
            let (Some(kind), true) = (kind, j > start) else {
                return Err(format!("bad variable at '{}'", &text[i..]));
            };
            let n: usize = text[start..j].parse().map_err(|_| "bad variable")?;
            if n == 0 || n > MAX_INLETS {
                return Err(format!("${kind}{n}: inlets count from 1"));
            }
            i = j;
            match kind {
                'v' | 'f' | 'i' => out.push(Tok::Var(kind, n - 1)),
                's' if opens_index(b, &mut i) => out.push(Tok::Table(TableName::Inlet(n - 1))),
                's' => return Err(format!("$s{n} names a table: read it as $s{n}[index]")),
                'x' | 'y' => return Err(format!("${kind} belongs to fexpr~, not supported")),
                _ => return Err(format!("unknown variable ${kind}{n}")),
            }
        } else if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            let name = text[start..i].to_string();
            if opens_index(b, &mut i) {
                out.push(Tok::Table(TableName::Named(name)));
            } else {
                out.push(Tok::Ident(name));
            }
        } else if c == '[' {
            return Err("'[' without a table name".into());
        } else if let Some(op) = OPS.iter().find(|op| text[i..].starts_with(**op)) {
            if *op == "=" {
                return Err("the assignment operator '=' is not supported".into());
            }
            out.push(Tok::Op(op));
            i += op.len();
        } else {
            return Err(format!("unexpected '{c}'"));
        }
    }
    Ok(out)
}

/// The expressions of one box, in an arena (children before parents).
#[derive(Debug, Clone, Default)]
struct Program {
    nodes: Vec<Node>,
    /// The root of each expression (one per outlet).
    roots: Vec<usize>,
    /// Whether each node depends on a signal (its value is a vector).
    vector: Vec<bool>,
    /// The tables read, one slot each.
    tables: Vec<TableName>,
}

struct Parser<'a> {
    toks: &'a [Tok],
    pos: usize,
    prog: &'a mut Program,
    /// Nesting of unary operators and parentheses (bounded: the parser recurses).
    depth: usize,
}

/// Deepest nesting of parentheses and unary operators accepted.
const MAX_DEPTH: usize = 200;

/// Binary operators by C precedence, loosest first.
const LEVELS: [&[(&str, Bin)]; 10] = [
    &[("||", Bin::LOr)],
    &[("&&", Bin::LAnd)],
    &[("|", Bin::Or)],
    &[("^", Bin::Xor)],
    &[("&", Bin::And)],
    &[("==", Bin::Eq), ("!=", Bin::Ne)],
    &[
        ("<", Bin::Lt),
        ("<=", Bin::Le),
        (">", Bin::Gt),
        (">=", Bin::Ge),
    ],
    &[("<<", Bin::Shl), (">>", Bin::Shr)],
    &[("+", Bin::Add), ("-", Bin::Sub)],
    &[("*", Bin::Mul), ("/", Bin::Div), ("%", Bin::Mod)],
];

impl Parser<'_> {
    fn push(&mut self, n: Node) -> usize {
        let v = match &n {
            Node::Const(_) | Node::Ctl(..) => false,
            Node::Sig(_) => true,
            Node::Unary(_, a) => self.prog.vector[*a],
            Node::Binary(_, a, b) => self.prog.vector[*a] || self.prog.vector[*b],
            Node::Call(_, args) => args.iter().any(|&a| self.prog.vector[a]),
            Node::Table(_, i) => self.prog.vector[*i],
        };
        self.prog.nodes.push(n);
        self.prog.vector.push(v);
        self.prog.nodes.len() - 1
    }

    fn peek_op(&self) -> Option<&'static str> {
        match self.toks.get(self.pos) {
            Some(Tok::Op(o)) => Some(o),
            _ => None,
        }
    }

    fn expect(&mut self, op: &str) -> Result<(), String> {
        if self.peek_op() == Some(op) {
            self.pos += 1;
            Ok(())
        } else {
            Err(format!("expected '{op}'"))
        }
    }

    fn binary(&mut self, level: usize) -> Result<usize, String> {
        if level == LEVELS.len() {
            return self.unary();
        }
        let mut left = self.binary(level + 1)?;
        while let Some(op) = self.peek_op() {
            let Some(&(_, bin)) = LEVELS[level].iter().find(|(s, _)| *s == op) else {
                break;
            };
            self.pos += 1;
            let right = self.binary(level + 1)?;
            left = self.push(Node::Binary(bin, left, right));
        }
        Ok(left)
    }

    fn unary(&mut self) -> Result<usize, String> {
        self.depth += 1;
        let r = self.unary_inner();
        self.depth -= 1;
        r
    }

    fn unary_inner(&mut self) -> Result<usize, String> {
        if self.depth > MAX_DEPTH {
            return Err(format!("nested more than {MAX_DEPTH} deep"));
        }
        let un = match self.peek_op() {
            Some("-") => Some(Un::Neg),
            Some("!") => Some(Un::Not),
            Some("~") => Some(Un::Compl),
            Some("+") => {
                self.pos += 1;
                return self.unary();
            }
            _ => None,
        };
        if let Some(un) = un {
            self.pos += 1;
            let a = self.unary()?;
            return Ok(self.push(Node::Unary(un, a)));
        }
        self.primary()
    }

    fn primary(&mut self) -> Result<usize, String> {
        let tok = self.toks.get(self.pos).cloned().ok_or("unexpected end")?;
        self.pos += 1;
        match tok {
            Tok::Num(v) => Ok(self.push(Node::Const(v))),
            Tok::Var('v', n) => Ok(self.push(Node::Sig(n))),
            Tok::Var(k, n) => Ok(self.push(Node::Ctl(n, k == 'i'))),
            Tok::Op("(") => {
                let e = self.binary(0)?;
                self.expect(")")?;
                Ok(e)
            }
            Tok::Ident(name) => {
                let (fun, arity) = function(&name).ok_or_else(|| {
                    if name == "random" {
                        "random() is not supported".to_string()
                    } else {
                        format!("unknown function '{name}'")
                    }
                })?;
                self.expect("(")?;
                let mut args = Vec::new();
                loop {
                    args.push(self.binary(0)?);
                    if self.peek_op() == Some(",") {
                        self.pos += 1;
                    } else {
                        break;
                    }
                }
                self.expect(")")?;
                if args.len() != arity {
                    return Err(format!(
                        "{name}() takes {arity} argument(s), not {}",
                        args.len()
                    ));
                }
                Ok(self.push(Node::Call(fun, args)))
            }
            Tok::Table(name) => {
                let index = self.binary(0)?;
                self.expect("]")?;
                let slot = match self.prog.tables.iter().position(|t| *t == name) {
                    Some(k) => k,
                    None => {
                        self.prog.tables.push(name);
                        self.prog.tables.len() - 1
                    }
                };
                Ok(self.push(Node::Table(slot, index)))
            }
            Tok::Op(o) => Err(format!("unexpected '{o}'")),
        }
    }
}

/// Parses the box's text: expressions separated by `;`.
fn compile(text: &str) -> Result<Program, String> {
    let mut prog = Program::default();
    for part in text.split(';') {
        if part.trim().is_empty() {
            return Err("an empty expression".into());
        }
        let toks = lex(part)?;
        let mut p = Parser {
            toks: &toks,
            pos: 0,
            prog: &mut prog,
            depth: 0,
        };
        let root = p.binary(0)?;
        if p.pos != toks.len() {
            return Err(format!("unexpected {:?} after the expression", toks[p.pos]));
        }
        prog.roots.push(root);
    }
    Ok(prog)
}

/// The scalar result of `op` (x_vexp.c's EVAL on two scalars).
fn bin_scalar(op: Bin, a: Sc, b: Sc) -> Sc {
    use Bin::*;
    let ia = |x: Sc| match x {
        Sc::Int(i) => i,
        Sc::Flt(f) => f as i64,
    };
    // Pd casts the operands of the integer operators to C's `int`.
    let i32_of = |x: Sc| match x {
        Sc::Int(i) => i as i32,
        Sc::Flt(f) => f as i32,
    };
    let both_int = matches!((a, b), (Sc::Int(_), Sc::Int(_)));
    // Operators that work on integers keep the operands' type for the result.
    let int_op = |r: i32| {
        if both_int {
            Sc::Int(r as i64)
        } else {
            Sc::Flt(r as f32)
        }
    };
    let (x32, y32) = (i32_of(a), i32_of(b));
    match op {
        Mod => int_op(if y32 != 0 { x32.wrapping_rem(y32) } else { 0 }),
        Shl => int_op(x32.wrapping_shl(y32 as u32)),
        Shr => int_op(x32.wrapping_shr(y32 as u32)),
        And => int_op(x32 & y32),
        Xor => int_op(x32 ^ y32),
        Or => int_op(x32 | y32),
        LAnd => int_op((x32 != 0 && y32 != 0) as i32),
        LOr => int_op((x32 != 0 || y32 != 0) as i32),
        _ if both_int => {
            let (x, y) = (ia(a), ia(b));
            Sc::Int(match op {
                Mul => x.wrapping_mul(y),
                Div => {
                    if y != 0 {
                        x.wrapping_div(y)
                    } else {
                        0
                    }
                }
                Add => x.wrapping_add(y),
                Sub => x.wrapping_sub(y),
                Lt => (x < y) as i64,
                Le => (x <= y) as i64,
                Gt => (x > y) as i64,
                Ge => (x >= y) as i64,
                Eq => (x == y) as i64,
                _ => (x != y) as i64,
            })
        }
        _ => Sc::Flt(bin_f32(op, a.f(), b.f())),
    }
}

/// One element of a float or vector operation.
#[inline]
fn bin_f32(op: Bin, x: f32, y: f32) -> f32 {
    use Bin::*;
    let b = |c: bool| c as i32 as f32;
    match op {
        Mul => x * y,
        Div => {
            if y != 0.0 {
                x / y
            } else {
                0.0
            }
        }
        Add => x + y,
        Sub => x - y,
        Lt => b(x < y),
        Le => b(x <= y),
        Gt => b(x > y),
        Ge => b(x >= y),
        Eq => b(x == y),
        Ne => b(x != y),
        Mod => {
            let d = y as i32;
            if d != 0 {
                (x as i32).wrapping_rem(d) as f32
            } else {
                0.0
            }
        }
        Shl => ((x as i32).wrapping_shl(y as i32 as u32)) as f32,
        Shr => ((x as i32).wrapping_shr(y as i32 as u32)) as f32,
        And => ((x as i32) & (y as i32)) as f32,
        Xor => ((x as i32) ^ (y as i32)) as f32,
        Or => ((x as i32) | (y as i32)) as f32,
        LAnd => b(x as i32 != 0 && y as i32 != 0),
        LOr => b(x as i32 != 0 || y as i32 != 0),
    }
}

fn un_scalar(op: Un, a: Sc) -> Sc {
    match (op, a) {
        (Un::Neg, Sc::Int(i)) => Sc::Int(i.wrapping_neg()),
        (Un::Neg, Sc::Flt(f)) => Sc::Flt(-f),
        (Un::Not, Sc::Int(i)) => Sc::Int((i == 0) as i64),
        (Un::Not, Sc::Flt(f)) => Sc::Flt((f == 0.0) as i32 as f32),
        (Un::Compl, Sc::Int(i)) => Sc::Int(!i),
        (Un::Compl, Sc::Flt(f)) => Sc::Flt(!(f as i64) as f32),
    }
}

fn un_f32(op: Un, x: f32) -> f32 {
    match op {
        Un::Neg => -x,
        Un::Not => (x == 0.0) as i32 as f32,
        Un::Compl => !(x as i64) as f32,
    }
}

/// A function of doubles, rounded to float, as x_vexp_fun.c computes them.
fn fun_f64(f: Fun, a: f64, b: f64) -> f32 {
    (match f {
        Fun::Min => a.min(b),
        Fun::Max => a.max(b),
        Fun::Int => a.trunc(),
        // C's rint in the default rounding mode.
        Fun::Rint => a.round_ties_even(),
        Fun::Float => a,
        Fun::Fmod => a % b,
        Fun::Floor => a.floor(),
        Fun::Ceil => a.ceil(),
        Fun::Pow => a.powf(b),
        Fun::Sqrt => a.sqrt(),
        Fun::Exp => a.exp(),
        Fun::Log10 => a.log10(),
        Fun::Ln => a.ln(),
        Fun::Sin => a.sin(),
        Fun::Cos => a.cos(),
        Fun::Tan => a.tan(),
        Fun::Asin => a.asin(),
        Fun::Acos => a.acos(),
        Fun::Atan => a.atan(),
        Fun::Atan2 => a.atan2(b),
        Fun::Sinh => a.sinh(),
        Fun::Cosh => a.cosh(),
        Fun::Tanh => a.tanh(),
        Fun::Abs => a.abs(),
        // Chosen per sample by the callers, never through here.
        Fun::If => a,
    }) as f32
}

fn call_scalar(f: Fun, args: &[Sc]) -> Sc {
    let a = args[0];
    let b = args.get(1).copied().unwrap_or(Sc::Int(0));
    match (f, a, b) {
        (Fun::If, _, _) => {
            if a.truthy() {
                b
            } else {
                args[2]
            }
        }
        (Fun::Min, Sc::Int(x), Sc::Int(y)) => Sc::Int(x.min(y)),
        (Fun::Max, Sc::Int(x), Sc::Int(y)) => Sc::Int(x.max(y)),
        (Fun::Abs, Sc::Int(x), _) => Sc::Int(x.wrapping_abs()),
        // `int` truncates and keeps the type (a float stays a float, as in Pd).
        (Fun::Int, Sc::Int(_), _) => a,
        (Fun::Int, Sc::Flt(f), _) => Sc::Flt(f.trunc()),
        _ => Sc::Flt(fun_f64(f, a.d(), b.d())),
    }
}

/// An operand while evaluating: a scalar, or node `k`'s vector buffer.
#[derive(Clone, Copy)]
enum Val {
    S(Sc),
    V(usize),
}

/// Evaluates the program's nodes for one block (or once, without signals).
#[derive(Debug, Default)]
struct Machine {
    /// Per node: its vector result (empty for scalar nodes).
    bufs: Vec<Vec<f32>>,
    /// Per node: its scalar result.
    scalars: Vec<Sc>,
}

impl Machine {
    fn prepare(&mut self, prog: &Program, block: usize) {
        self.bufs = prog
            .vector
            .iter()
            .map(|&v| if v { vec![0.0; block] } else { Vec::new() })
            .collect();
        self.scalars = vec![Sc::Int(0); prog.nodes.len()];
    }

    /// Evaluates every node in arena order (children first). `sig(k)` is signal inlet k's
    /// block, `ctl[k]` float inlet k's value.
    fn run(&mut self, prog: &Program, sig: &[&[f32]], ctl: &[f32], tables: &[Option<Array>]) {
        for k in 0..prog.nodes.len() {
            let scalars = &self.scalars;
            let val = |c: usize| {
                if prog.vector[c] {
                    Val::V(c)
                } else {
                    Val::S(scalars[c])
                }
            };
            let (done, rest) = self.bufs.split_at_mut(k);
            let out = &mut rest[0];
            let get = |v: Val, i: usize| match v {
                Val::S(s) => s.f(),
                Val::V(c) => done[c][i],
            };
            match &prog.nodes[k] {
                Node::Const(c) => self.scalars[k] = *c,
                Node::Ctl(n, int) => {
                    let v = ctl.get(*n).copied().unwrap_or(0.0);
                    self.scalars[k] = if *int { Sc::Int(v as i64) } else { Sc::Flt(v) };
                }
                Node::Sig(n) => match sig.get(*n) {
                    Some(s) if s.len() == out.len() => out.copy_from_slice(s),
                    _ => out.fill(0.0),
                },
                Node::Unary(op, a) => match val(*a) {
                    Val::S(s) => self.scalars[k] = un_scalar(*op, s),
                    Val::V(c) => {
                        for (o, &x) in out.iter_mut().zip(&done[c]) {
                            *o = un_f32(*op, x);
                        }
                    }
                },
                Node::Binary(op, a, b) => match (val(*a), val(*b)) {
                    (Val::S(x), Val::S(y)) => self.scalars[k] = bin_scalar(*op, x, y),
                    (va, vb) => {
                        for (i, o) in out.iter_mut().enumerate() {
                            *o = bin_f32(*op, get(va, i), get(vb, i));
                        }
                    }
                },
                Node::Table(slot, index) => {
                    let guard = tables
                        .get(*slot)
                        .and_then(Option::as_ref)
                        .map(|a| a.read().unwrap_or_else(|e| e.into_inner()));
                    let data: &[f32] = guard.as_deref().map_or(&[], Vec::as_slice);
                    // Pd truncates the index and clamps it into the table; no table reads 0.
                    let at = |i: i64| match data.len() {
                        0 => 0.0,
                        n => data[i.clamp(0, n as i64 - 1) as usize],
                    };
                    match val(*index) {
                        Val::S(Sc::Int(i)) => self.scalars[k] = Sc::Flt(at(i)),
                        Val::S(Sc::Flt(f)) => self.scalars[k] = Sc::Flt(at(f as i64)),
                        // Pd 0.53 refuses a signal index ("bad argument for table") and
                        // reads 0: tabread~ is the object for that.
                        Val::V(_) => out.fill(0.0),
                    }
                }
                Node::Call(f, args) => {
                    let vals: [Val; 3] = std::array::from_fn(|j| {
                        args.get(j).map_or(Val::S(Sc::Int(0)), |&c| val(c))
                    });
                    if !prog.vector[k] {
                        let s: [Sc; 3] = std::array::from_fn(|j| {
                            args.get(j).map_or(Sc::Int(0), |&c| self.scalars[c])
                        });
                        self.scalars[k] = call_scalar(*f, &s);
                    } else if *f == Fun::If {
                        for (i, o) in out.iter_mut().enumerate() {
                            *o = if get(vals[0], i) != 0.0 {
                                get(vals[1], i)
                            } else {
                                get(vals[2], i)
                            };
                        }
                    } else {
                        for (i, o) in out.iter_mut().enumerate() {
                            let (x, y) = (get(vals[0], i), get(vals[1], i));
                            *o = match f {
                                // Pd compares floats for min and max of vectors.
                                Fun::Min => x.min(y),
                                Fun::Max => x.max(y),
                                Fun::Int => x.trunc(),
                                _ => fun_f64(*f, x as f64, y as f64),
                            };
                        }
                    }
                }
            }
        }
    }
}

/// Joins the box's atoms into the expression text, as Pd's expr does.
fn text_of(args: &[Atom]) -> String {
    args.iter()
        .map(|a| match a {
            // As Pd's %g writes them: small whole numbers as integers, the rest as floats
            // (with an exponent where %g uses one, so that the lexer reads them as floats).
            Atom::Float(f) if f.fract() == 0.0 && f.abs() < 1e6 => format!("{}", *f as i64),
            Atom::Float(f) if f.abs() >= 1e6 => format!("{f:e}"),
            a => a.to_string(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Most inlets an `expr` box may have.
const MAX_INLETS: usize = 16;

/// The inlets an expression uses: per inlet, whether it is a signal.
fn inlets(prog: &Program, dsp: bool) -> Result<Vec<Port>, String> {
    let mut ports: Vec<Option<Port>> = vec![None];
    for n in &prog.nodes {
        let (k, p) = match n {
            Node::Sig(k) => (*k, Port::Signal),
            Node::Ctl(k, _) => (*k, Port::Control),
            Node::Table(slot, _) => match prog.tables[*slot] {
                TableName::Inlet(k) => (k, Port::Control),
                TableName::Named(_) => continue,
            },
            _ => continue,
        };
        if ports.len() <= k {
            ports.resize(k + 1, None);
        }
        match ports[k] {
            Some(q) if q != p => return Err(format!("inlet {} used as signal and float", k + 1)),
            _ => ports[k] = Some(p),
        }
    }
    if ports.len() > MAX_INLETS {
        return Err(format!("at most {MAX_INLETS} inlets"));
    }
    if !dsp && ports.contains(&Some(Port::Signal)) {
        return Err("$v (a signal) needs expr~".into());
    }
    if dsp && ports[0] == Some(Port::Control) {
        return Err("the first inlet of expr~ is a signal: use $v1".into());
    }
    Ok(ports
        .into_iter()
        .enumerate()
        .map(|(k, p)| {
            p.unwrap_or(if dsp && k == 0 {
                Port::Signal
            } else {
                Port::Control
            })
        })
        .collect())
}

/// What `expr` and `expr~` share: the program, its inlets' values and its tables.
#[derive(Debug)]
struct State {
    prog: Program,
    ins: Vec<Port>,
    /// Per inlet: its float (a control inlet's value, a signal inlet's scalar).
    floats: Vec<f32>,
    /// Per inlet: the table name it was sent (`$sN`).
    names: Vec<Option<String>>,
    /// Per table slot: the array, once found.
    arrays: Vec<Option<Array>>,
    machine: Machine,
}

impl State {
    fn new(prog: Program, ins: Vec<Port>) -> State {
        let mut machine = Machine::default();
        machine.prepare(&prog, 1);
        State {
            floats: vec![0.0; ins.len()],
            names: vec![None; ins.len()],
            arrays: vec![None; prog.tables.len()],
            prog,
            ins,
            machine,
        }
    }

    /// Finds the arrays the tables name now (a missing one reads as 0, as Pd's does after
    /// its "no such table" error).
    fn resolve(&mut self, shared: &Shared) {
        for (slot, t) in self.prog.tables.iter().enumerate() {
            let name = match t {
                TableName::Named(n) => Some(n.as_str()),
                TableName::Inlet(k) => self.names.get(*k).and_then(|n| n.as_deref()),
            };
            self.arrays[slot] = name.and_then(|n| shared.array(n));
        }
    }

    /// A float or a table name at `inlet`.
    fn take(&mut self, inlet: usize, msg: &Msg, cx: &Cx<'_>) {
        match msg.selector.as_str() {
            "float" => {
                if let Some(f) = self.floats.get_mut(inlet) {
                    *f = msg.f(0);
                }
            }
            "symbol" => {
                if let Some(n) = self.names.get_mut(inlet) {
                    *n = msg.args.first().map(|a| a.to_string());
                    self.resolve(cx.shared);
                }
            }
            _ => {}
        }
    }
}

/// `expr~`.
#[derive(Debug)]
pub struct ExprTilde(State);

impl PdObject for ExprTilde {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (
            self.0.ins.clone(),
            vec![Port::Signal; self.0.prog.roots.len()],
        )
    }
    fn message(&mut self, inlet: usize, msg: &Msg, cx: &mut Cx<'_>) {
        self.0.take(inlet, msg, cx);
    }
    fn is_dsp(&self) -> bool {
        true
    }
    fn signal_scalar(&self, inlet: usize) -> f32 {
        self.0.floats.get(inlet).copied().unwrap_or(0.0)
    }
    fn prepare(&mut self, env: &DspEnv<'_>) {
        self.0.machine.prepare(&self.0.prog, env.block);
        self.0.resolve(env.shared);
    }
    fn perform(&mut self, ins: &[&[f32]], outs: &mut [&mut [f32]]) {
        let st = &mut self.0;
        // `ins` holds the signal inlets in order; map inlet numbers onto it.
        let mut sig: [&[f32]; MAX_INLETS] = [&[]; MAX_INLETS];
        let mut s = 0;
        for (k, p) in st.ins.iter().enumerate() {
            if *p == Port::Signal {
                sig[k] = ins.get(s).copied().unwrap_or(&[]);
                s += 1;
            }
        }
        st.machine.run(&st.prog, &sig, &st.floats, &st.arrays);
        for (out, &root) in outs.iter_mut().zip(&st.prog.roots) {
            if st.prog.vector[root] {
                out.copy_from_slice(&st.machine.bufs[root]);
            } else {
                out.fill(st.machine.scalars[root].f());
            }
        }
    }
    fn cost_hint_ns(&self) -> u32 {
        20 + 10 * self.0.prog.nodes.len() as u32
    }
}

/// `expr`.
#[derive(Debug)]
pub struct Expr(State);

impl Expr {
    fn fire(&mut self, cx: &mut Cx<'_>) {
        let st = &mut self.0;
        st.resolve(cx.shared);
        st.machine.run(&st.prog, &[], &st.floats, &st.arrays);
        // Right to left, as Pd's outlets fire.
        for (k, &root) in st.prog.roots.iter().enumerate().rev() {
            cx.out(k, Msg::float(st.machine.scalars[root].f()));
        }
    }
}

impl PdObject for Expr {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (
            self.0.ins.clone(),
            vec![Port::Control; self.0.prog.roots.len()],
        )
    }
    fn message(&mut self, inlet: usize, msg: &Msg, cx: &mut Cx<'_>) {
        self.0.take(inlet, msg, cx);
        if inlet == 0 && matches!(msg.selector.as_str(), "float" | "bang") {
            self.fire(cx);
        }
    }
}

/// Creates `expr~` or `expr`.
pub fn create(class: &str, args: &[Atom]) -> Result<Option<Box<dyn PdObject>>, CreateError> {
    let dsp = match class {
        "expr~" => true,
        "expr" => false,
        _ => return Ok(None),
    };
    let bad = |what: String| CreateError::BadArgs {
        class: class.to_string(),
        what,
    };
    let text = text_of(args);
    let prog = compile(&text).map_err(|e| bad(format!("{e} in '{text}'")))?;
    let ins = inlets(&prog, dsp).map_err(|e| bad(format!("{e} in '{text}'")))?;
    let st = State::new(prog, ins);
    Ok(Some(if dsp {
        Box::new(ExprTilde(st))
    } else {
        Box::new(Expr(st))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(text: &str, ctl: &[f32]) -> Sc {
        let prog = compile(text).unwrap();
        let mut m = Machine::default();
        m.prepare(&prog, 1);
        m.run(&prog, &[], ctl, &[]);
        m.scalars[prog.roots[0]]
    }

    #[test]
    fn precedence_and_types_follow_c_and_pd() {
        assert_eq!(eval("1 + 2 * 3", &[]), Sc::Int(7));
        assert_eq!(eval("(1 + 2) * 3", &[]), Sc::Int(9));
        assert_eq!(eval("1/2", &[]), Sc::Int(0));
        assert_eq!(eval("1/2.", &[]), Sc::Flt(0.5));
        assert_eq!(eval("7 % 3", &[]), Sc::Int(1));
        assert_eq!(eval("1/0", &[]), Sc::Int(0));
        assert_eq!(eval("2 < 3 && 3 < 2", &[]), Sc::Int(0));
        assert_eq!(eval("1 << 4 | 1", &[]), Sc::Int(17));
        assert_eq!(eval("-2 * -3", &[]), Sc::Int(6));
        assert_eq!(eval("!0 + ~0", &[]), Sc::Int(0));
        assert_eq!(eval("$f1 * 2", &[1.5]), Sc::Flt(3.0));
        assert_eq!(eval("$i1 * 2", &[1.5]), Sc::Int(2));
        assert_eq!(eval("int(2.7) + 1", &[]), Sc::Flt(3.0));
        assert_eq!(eval("int(7.5) / 2", &[]), Sc::Flt(3.5));
        assert_eq!(eval("int(7) / 2", &[]), Sc::Int(3));
        assert_eq!(eval("1 << 40", &[]), Sc::Int(256));
        assert_eq!(eval("$f1 % -1", &[-1e19]), Sc::Flt(0.0));
        assert_eq!(eval("1e20 * 0", &[]), Sc::Flt(0.0));
        assert_eq!(eval("if($f1 > 1, 10, 20)", &[2.0]), Sc::Int(10));
        assert_eq!(eval("min(3, 2)", &[]), Sc::Int(2));
        assert_eq!(eval("rint(2.5) + rint(3.5)", &[]), Sc::Flt(6.0));
        assert_eq!(eval("pow(2, 10)", &[]), Sc::Flt(1024.0));
        assert_eq!(eval("1e3 + .5", &[]), Sc::Flt(1000.5));
    }

    #[test]
    fn signals_are_computed_per_sample() {
        let prog = compile("$v1 * $f2 + sin($v1) ; $v1 > 0.5").unwrap();
        let mut m = Machine::default();
        m.prepare(&prog, 3);
        let x = [0.0f32, 0.5, 1.0];
        m.run(&prog, &[&x], &[0.0, 2.0], &[]);
        let y = &m.bufs[prog.roots[0]];
        for (i, &v) in x.iter().enumerate() {
            assert!((y[i] - (v * 2.0 + (v as f64).sin() as f32)).abs() < 1e-7);
        }
        assert_eq!(m.bufs[prog.roots[1]], vec![0.0, 0.0, 1.0]);
    }

    #[test]
    fn tables_read_clamped_truncated_and_zero_when_missing() {
        let prog = compile("t[2.9] + t[-3] * 10 + t[99] * 100 + nope[0] ; $s2[1]").unwrap();
        assert_eq!(
            prog.tables,
            vec![
                TableName::Named("t".into()),
                TableName::Named("nope".into()),
                TableName::Inlet(1)
            ]
        );
        let t: Array = Arc::new(RwLock::new(vec![1.0, 2.0, 3.0, 4.0]));
        let mut m = Machine::default();
        m.prepare(&prog, 1);
        m.run(&prog, &[], &[], &[Some(t.clone()), None, Some(t)]);
        // t[2] + t[0] * 10 + t[3] * 100 + 0
        assert_eq!(m.scalars[prog.roots[0]], Sc::Flt(3.0 + 10.0 + 400.0));
        assert_eq!(m.scalars[prog.roots[1]], Sc::Flt(2.0));
        let ins = inlets(&prog, false).unwrap();
        assert_eq!(ins, vec![Port::Control, Port::Control]);
    }

    #[test]
    fn inlets_follow_the_variables() {
        let prog = compile("$v1 + $f3").unwrap();
        assert_eq!(
            inlets(&prog, true).unwrap(),
            vec![Port::Signal, Port::Control, Port::Control]
        );
        let prog = compile("$f1 + 1").unwrap();
        assert!(inlets(&prog, true).is_err());
        assert!(inlets(&compile("$v1").unwrap(), false).is_err());
        assert!(inlets(&compile("$v1 + $f1").unwrap(), true).is_err());
    }

    #[test]
    fn bad_expressions_are_clear_errors() {
        for (text, want) in [
            ("1 +", "unexpected end"),
            ("foo(1)", "unknown function 'foo'"),
            ("sin(1, 2)", "takes 1"),
            ("tab[1", "expected ']'"),
            ("$s1 + 1", "names a table"),
            ("[1]", "without a table name"),
            ("a = 1", "not supported"),
            ("random(0, 1)", "random"),
            ("(1 + 2", "expected ')'"),
            ("1 2", "after the expression"),
            ("$v0", "count from 1"),
            ("1 ;", "empty expression"),
            (&"(".repeat(5000), "nested"),
            (&"-".repeat(5000), "nested"),
        ] {
            let e = compile(text).unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
        }
    }
}
