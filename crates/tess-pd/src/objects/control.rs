//! Control objects (Pd 0.53's x_time.c, x_connective.c, x_arithmetic.c, g_text.c message
//! boxes): `loadbang`, `metro`, `delay`, `line`, `f`, `i`, `+ - * /`, `s`/`r`, `t`, `pack`,
//! `unpack`, `route`, `sel`, `mtof`, `print`, `bang`, the subpatch ports `inlet`/`outlet`,
//! message boxes and number boxes.

use super::{farg, sarg, CreateError, Cx, PdObject, Port};
use crate::atom::{substitute, Atom, Msg};
use crate::parse::Token;

/// `loadbang`.
#[derive(Debug)]
pub struct Loadbang;

impl PdObject for Loadbang {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![], vec![Port::Control])
    }
    fn loadbang(&mut self, cx: &mut Cx<'_>) {
        cx.out(0, Msg::bang());
    }
}

/// `metro MS`.
///
/// Pd's `metro_tick` outputs, then re-arms its clock unless a message reached the metro
/// during the output (`x_hit`). Outputs run after the call here, so each tick is a numbered
/// "open tick" until its [`Action::Resume`](super::Action::Resume): a message arriving in
/// between marks every open tick as hit.
#[derive(Debug)]
pub struct Metro {
    deltime: f64,
    gen: u32,
    open: Vec<(u32, bool)>,
}

impl Metro {
    fn set_time(&mut self, g: f32) {
        self.deltime = if g <= 0.0 { 1.0 } else { g as f64 };
    }
    fn tick(&mut self, cx: &mut Cx<'_>) {
        self.gen = self.gen.wrapping_add(1);
        self.open.push((self.gen, false));
        cx.out(0, Msg::bang());
        cx.actions.push(super::Action::Resume(self.gen));
    }
    fn hit(&mut self) {
        for t in &mut self.open {
            t.1 = true;
        }
    }
}

impl PdObject for Metro {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Control, Port::Control], vec![Port::Control])
    }
    fn message(&mut self, inlet: usize, msg: &Msg, cx: &mut Cx<'_>) {
        match (inlet, msg.selector.as_str()) {
            (1, "float") => self.set_time(msg.f(0)),
            (0, "float") | (0, "bang") => {
                self.hit();
                if msg.selector == "bang" || msg.f(0) != 0.0 {
                    self.tick(cx);
                } else {
                    cx.actions.push(super::Action::UnsetClock(0));
                }
            }
            (0, "stop") => {
                self.hit();
                cx.actions.push(super::Action::UnsetClock(0));
            }
            _ => {}
        }
    }
    fn clock(&mut self, _tag: u32, cx: &mut Cx<'_>) {
        self.tick(cx);
    }
    fn resume(&mut self, tag: u32, cx: &mut Cx<'_>) {
        if let Some(pos) = self.open.iter().position(|t| t.0 == tag) {
            let (_, hit) = self.open.remove(pos);
            if !hit {
                cx.actions.push(super::Action::SetClock(0, self.deltime));
            }
        }
    }
}

/// `delay MS` / `del`.
#[derive(Debug)]
pub struct Delay {
    deltime: f64,
}

impl PdObject for Delay {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Control, Port::Control], vec![Port::Control])
    }
    fn message(&mut self, inlet: usize, msg: &Msg, cx: &mut Cx<'_>) {
        match (inlet, msg.selector.as_str()) {
            (1, "float") => self.deltime = msg.f(0).max(0.0) as f64,
            (0, "float") => {
                self.deltime = msg.f(0).max(0.0) as f64;
                cx.actions.push(super::Action::SetClock(0, self.deltime));
            }
            (0, "bang") => cx.actions.push(super::Action::SetClock(0, self.deltime)),
            (0, "stop") => cx.actions.push(super::Action::UnsetClock(0)),
            _ => {}
        }
    }
    fn clock(&mut self, _tag: u32, cx: &mut Cx<'_>) {
        cx.out(0, Msg::bang());
    }
}

/// `line START GRAIN`: control-rate ramps, output every `grain` ms (default 20).
#[derive(Debug)]
pub struct Line {
    targetval: f64,
    setval: f64,
    targettime: f64,
    prevtime: f64,
    one_over_timediff: f64,
    in1val: f32,
    grain: f32,
    gotinlet: bool,
}

/// Pd's time unit per millisecond (m_sched.c `TIMEUNITPERMSEC`).
pub const TIME_UNITS_PER_MS: f64 = 32.0 * 441.0;

impl Line {
    fn tick(&mut self, cx: &mut Cx<'_>) {
        let timenow = cx.now_ms * TIME_UNITS_PER_MS;
        let msectogo = (self.targettime - timenow) / TIME_UNITS_PER_MS;
        if msectogo < 1e-9 {
            cx.out(0, Msg::float(self.targetval as f32));
        } else {
            let v = self.setval
                + self.one_over_timediff
                    * (timenow - self.prevtime)
                    * (self.targetval - self.setval);
            cx.out(0, Msg::float(v as f32));
            if self.grain <= 0.0 {
                self.grain = 20.0;
            }
            let g = self.grain as f64;
            cx.actions.push(super::Action::SetClock(
                0,
                if g > msectogo { msectogo } else { g },
            ));
        }
    }
}

impl PdObject for Line {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Control; 3], vec![Port::Control])
    }
    fn message(&mut self, inlet: usize, msg: &Msg, cx: &mut Cx<'_>) {
        match (inlet, msg.selector.as_str()) {
            (1, "float") => {
                self.in1val = msg.f(0);
                self.gotinlet = true;
            }
            (2, "float") => self.grain = msg.f(0),
            (0, "stop") => cx.actions.push(super::Action::UnsetClock(0)),
            (0, "set") => {
                cx.actions.push(super::Action::UnsetClock(0));
                self.targetval = msg.f(0) as f64;
                self.setval = self.targetval;
            }
            (0, "float") => {
                let f = msg.f(0) as f64;
                let timenow = cx.now_ms * TIME_UNITS_PER_MS;
                if self.gotinlet && self.in1val > 0.0 {
                    if timenow > self.targettime {
                        self.setval = self.targetval;
                    } else {
                        self.setval += self.one_over_timediff
                            * (timenow - self.prevtime)
                            * (self.targetval - self.setval);
                    }
                    self.prevtime = timenow;
                    self.targettime = timenow + TIME_UNITS_PER_MS * self.in1val as f64;
                    self.targetval = f;
                    // Pd's line_float calls line_tick before the new slope is set.
                    let before = cx.actions.len();
                    self.tick(cx);
                    cx.actions.truncate(before + 1); // keep the output, re-arm below
                    self.gotinlet = false;
                    self.one_over_timediff = 1.0 / (self.targettime - timenow);
                    if self.grain <= 0.0 {
                        self.grain = 20.0;
                    }
                    let g = self.grain.min(self.in1val) as f64;
                    cx.actions.push(super::Action::SetClock(0, g));
                } else {
                    cx.actions.push(super::Action::UnsetClock(0));
                    self.targetval = f;
                    self.setval = f;
                    cx.out(0, Msg::float(f as f32));
                }
                self.gotinlet = false;
            }
            _ => {}
        }
    }
    fn clock(&mut self, _tag: u32, cx: &mut Cx<'_>) {
        self.tick(cx);
    }
}

/// `f` / `float` and `i` / `int`: stores a number.
#[derive(Debug)]
pub struct FloatBox {
    value: f32,
    int: bool,
}

impl PdObject for FloatBox {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Control, Port::Control], vec![Port::Control])
    }
    fn message(&mut self, inlet: usize, msg: &Msg, cx: &mut Cx<'_>) {
        let conv = |f: f32, int: bool| if int { f.trunc() } else { f };
        match (inlet, msg.selector.as_str()) {
            (1, "float") => self.value = conv(msg.f(0), self.int),
            (0, "float") => {
                self.value = conv(msg.f(0), self.int);
                cx.out(0, Msg::float(self.value));
            }
            (0, "bang") => cx.out(0, Msg::float(self.value)),
            (0, "set") => self.value = conv(msg.f(0), self.int),
            _ => {}
        }
    }
}

/// `+ - * /` (and others of x_arithmetic.c's binops).
#[derive(Debug)]
pub struct Arith {
    op: char,
    left: f32,
    right: f32,
}

impl PdObject for Arith {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Control, Port::Control], vec![Port::Control])
    }
    fn message(&mut self, inlet: usize, msg: &Msg, cx: &mut Cx<'_>) {
        match (inlet, msg.selector.as_str()) {
            (1, "float") => self.right = msg.f(0),
            (0, "float") | (0, "bang") => {
                if msg.selector == "float" {
                    self.left = msg.f(0);
                }
                let (a, b) = (self.left, self.right);
                let r = match self.op {
                    '+' => a + b,
                    '-' => a - b,
                    '*' => a * b,
                    _ => {
                        if b != 0.0 {
                            a / b
                        } else {
                            0.0
                        }
                    }
                };
                cx.out(0, Msg::float(r));
            }
            _ => {}
        }
    }
}

/// `s NAME` / `send`.
#[derive(Debug)]
pub struct Send {
    name: String,
}

impl PdObject for Send {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Control, Port::Control], vec![])
    }
    fn distributes_lists(&self) -> bool {
        false
    }
    fn message(&mut self, inlet: usize, msg: &Msg, cx: &mut Cx<'_>) {
        if inlet == 1 {
            if let Some(s) = msg.args.first().and_then(Atom::symbol) {
                self.name = s.to_string();
            }
        } else if !self.name.is_empty() {
            cx.actions
                .push(super::Action::Send(self.name.clone(), msg.clone()));
        }
    }
}

/// `r NAME` / `receive`: the engine delivers messages for NAME to its inlet 0 (hidden).
#[derive(Debug)]
pub struct Receive {
    /// The name received.
    pub name: String,
}

impl PdObject for Receive {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![], vec![Port::Control])
    }
    fn distributes_lists(&self) -> bool {
        false
    }
    fn message(&mut self, _inlet: usize, msg: &Msg, cx: &mut Cx<'_>) {
        cx.out(0, msg.clone());
    }
}

/// `t b f s l a` / `trigger`: right to left.
#[derive(Debug)]
pub struct Trigger {
    kinds: Vec<char>,
}

impl PdObject for Trigger {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Control], vec![Port::Control; self.kinds.len()])
    }
    fn distributes_lists(&self) -> bool {
        false
    }
    fn message(&mut self, _inlet: usize, msg: &Msg, cx: &mut Cx<'_>) {
        for (i, k) in self.kinds.iter().enumerate().rev() {
            let m = match k {
                'b' => Msg::bang(),
                'f' => Msg::float(msg.f(0)),
                's' => Msg::symbol(
                    msg.args
                        .first()
                        .and_then(Atom::symbol)
                        .unwrap_or(msg.selector.as_str()),
                ),
                'l' => Msg::from_atoms(msg.as_list()),
                _ => msg.clone(),
            };
            cx.out(i, m);
        }
    }
}

/// `pack f f ...`.
#[derive(Debug)]
pub struct Pack {
    values: Vec<Atom>,
}

impl PdObject for Pack {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Control; self.values.len()], vec![Port::Control])
    }
    fn message(&mut self, inlet: usize, msg: &Msg, cx: &mut Cx<'_>) {
        if inlet >= self.values.len() {
            return;
        }
        match msg.selector.as_str() {
            "float" => self.values[inlet] = Atom::Float(msg.f(0)),
            "symbol" => self.values[inlet] = msg.args.first().cloned().unwrap_or(Atom::Float(0.0)),
            "bang" => {}
            _ => return,
        }
        if inlet == 0 {
            cx.out(0, Msg::from_atoms(self.values.clone()));
        }
    }
}

/// `unpack f f ...`: right to left.
#[derive(Debug)]
pub struct Unpack {
    n: usize,
}

impl PdObject for Unpack {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Control], vec![Port::Control; self.n])
    }
    fn distributes_lists(&self) -> bool {
        false
    }
    fn message(&mut self, _inlet: usize, msg: &Msg, cx: &mut Cx<'_>) {
        let l = msg.as_list();
        for i in (0..l.len().min(self.n)).rev() {
            let m = match &l[i] {
                Atom::Float(f) => Msg::float(*f),
                Atom::Symbol(s) => Msg::symbol(s),
            };
            cx.out(i, m);
        }
    }
}

/// `route a b ...`: by selector (symbols) or first float.
#[derive(Debug)]
pub struct Route {
    keys: Vec<Atom>,
}

impl PdObject for Route {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (
            vec![Port::Control],
            vec![Port::Control; self.keys.len() + 1],
        )
    }
    fn distributes_lists(&self) -> bool {
        false
    }
    fn message(&mut self, _inlet: usize, msg: &Msg, cx: &mut Cx<'_>) {
        let list = msg.as_list();
        for (i, k) in self.keys.iter().enumerate() {
            match k {
                Atom::Float(f) => {
                    if let Some(Atom::Float(g)) = list.first() {
                        if g == f {
                            cx.out(i, Msg::from_atoms(list[1..].to_vec()));
                            return;
                        }
                    }
                }
                Atom::Symbol(s) => {
                    if &msg.selector == s {
                        cx.out(i, Msg::from_atoms(msg.args.clone()));
                        return;
                    }
                }
            }
        }
        cx.out(self.keys.len(), msg.clone());
    }
}

/// `sel a b ...`: bang on a match, else pass through.
#[derive(Debug)]
pub struct Select {
    keys: Vec<Atom>,
}

impl PdObject for Select {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        let ins = if self.keys.len() == 1 { 2 } else { 1 };
        (
            vec![Port::Control; ins],
            vec![Port::Control; self.keys.len() + 1],
        )
    }
    fn message(&mut self, inlet: usize, msg: &Msg, cx: &mut Cx<'_>) {
        if inlet == 1 {
            self.keys[0] = msg.args.first().cloned().unwrap_or(Atom::Float(0.0));
            return;
        }
        let v = msg.args.first().cloned().unwrap_or(Atom::Float(0.0));
        for (i, k) in self.keys.iter().enumerate() {
            if *k == v {
                cx.out(i, Msg::bang());
                return;
            }
        }
        cx.out(self.keys.len(), msg.clone());
    }
}

/// `mtof`.
#[derive(Debug)]
pub struct Mtof;

impl PdObject for Mtof {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Control], vec![Port::Control])
    }
    fn message(&mut self, _inlet: usize, msg: &Msg, cx: &mut Cx<'_>) {
        if msg.selector == "float" {
            cx.out(0, Msg::float(super::math::mtof(msg.f(0))));
        }
    }
}

/// `print NAME`: writes to stderr.
#[derive(Debug)]
pub struct Print {
    name: String,
}

impl PdObject for Print {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Control], vec![])
    }
    fn distributes_lists(&self) -> bool {
        false
    }
    fn message(&mut self, _inlet: usize, msg: &Msg, _cx: &mut Cx<'_>) {
        eprintln!("{}", print_line(&self.name, msg));
    }
}

/// What Pd 0.53's `print` posts for `msg` (x_interface.c): a float or a list that starts with
/// a number without a selector, a list that starts with a symbol as `list ...`.
fn print_line(name: &str, msg: &Msg) -> String {
    let args: Vec<String> = msg.args.iter().map(ToString::to_string).collect();
    let numbers_first = matches!(msg.args.first(), Some(Atom::Float(_)));
    match msg.selector.as_str() {
        "float" | "list" if numbers_first => format!("{name}: {}", args.join(" ")),
        "list" if args.is_empty() => format!("{name}: bang"),
        sel if args.is_empty() => format!("{name}: {sel}"),
        sel => format!("{name}: {sel} {}", args.join(" ")),
    }
}

/// `bang` / `b`, and the message-passing ports (`inlet`, `outlet`, number boxes): pass on.
#[derive(Debug)]
pub struct Pass {
    bang: bool,
    inlets: usize,
}

impl PdObject for Pass {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Control; self.inlets], vec![Port::Control])
    }
    fn distributes_lists(&self) -> bool {
        false
    }
    fn message(&mut self, _inlet: usize, msg: &Msg, cx: &mut Cx<'_>) {
        cx.out(0, if self.bang { Msg::bang() } else { msg.clone() });
    }
}

/// A message box: `$N` from the incoming message, `,` separates messages, `;` sends to a
/// receiver named by the next word.
#[derive(Debug)]
pub struct MsgBox {
    tokens: Vec<Token>,
}

impl MsgBox {
    /// A message box with this content (from the patch file).
    pub fn new(tokens: Vec<Token>) -> MsgBox {
        MsgBox { tokens }
    }
}

impl PdObject for MsgBox {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Control], vec![Port::Control])
    }
    fn distributes_lists(&self) -> bool {
        false
    }
    fn message(&mut self, _inlet: usize, msg: &Msg, cx: &mut Cx<'_>) {
        if msg.selector == "set" {
            self.tokens = msg.args.iter().cloned().map(Token::Atom).collect();
            return;
        }
        let args = msg.as_list();
        let mut target: Option<String> = None;
        let mut cur: Vec<Atom> = Vec::new();
        let mut expect_target = false;
        let flush = |cur: &mut Vec<Atom>, target: &Option<String>, cx: &mut Cx<'_>| {
            if cur.is_empty() {
                return;
            }
            let m = Msg::from_atoms(std::mem::take(cur));
            match target {
                None => cx.out(0, m),
                Some(t) => cx.actions.push(super::Action::Send(t.clone(), m)),
            }
        };
        for t in &self.tokens {
            match t {
                Token::Comma => flush(&mut cur, &target, cx),
                Token::Semi => {
                    flush(&mut cur, &target, cx);
                    expect_target = true;
                }
                t if expect_target => {
                    let a = match t {
                        Token::Dollar(d) => substitute(d, &args, 0).unwrap_or(Atom::Float(0.0)),
                        Token::Atom(a) => a.clone(),
                        _ => continue,
                    };
                    target = Some(a.to_string());
                    expect_target = false;
                }
                Token::Atom(a) => cur.push(a.clone()),
                Token::Dollar(d) => cur.push(substitute(d, &args, 0).unwrap_or(Atom::Float(0.0))),
            }
        }
        flush(&mut cur, &target, cx);
    }
}

/// Creates a control object, `Ok(None)` if `class` is not one.
pub fn create(class: &str, args: &[Atom]) -> Result<Option<Box<dyn PdObject>>, CreateError> {
    let bad = |what: &str| CreateError::BadArgs {
        class: class.to_string(),
        what: what.to_string(),
    };
    Ok(Some(match class {
        "loadbang" => Box::new(Loadbang),
        "metro" => {
            let mut m = Metro {
                deltime: 1.0,
                gen: 0,
                open: Vec::new(),
            };
            m.set_time(farg(args, 0, 0.0));
            Box::new(m)
        }
        "delay" | "del" => Box::new(Delay {
            deltime: farg(args, 0, 0.0).max(0.0) as f64,
        }),
        "line" => Box::new(Line {
            targetval: farg(args, 0, 0.0) as f64,
            setval: farg(args, 0, 0.0) as f64,
            targettime: 0.0,
            prevtime: 0.0,
            one_over_timediff: 1.0,
            in1val: 0.0,
            grain: farg(args, 1, 0.0),
            gotinlet: false,
        }),
        "f" | "float" => Box::new(FloatBox {
            value: farg(args, 0, 0.0),
            int: false,
        }),
        "i" | "int" => Box::new(FloatBox {
            value: farg(args, 0, 0.0).trunc(),
            int: true,
        }),
        "+" | "-" | "*" | "/" => Box::new(Arith {
            op: class.chars().next().unwrap_or('+'),
            left: 0.0,
            right: farg(args, 0, 0.0),
        }),
        "s" | "send" => Box::new(Send {
            name: sarg(args, 0),
        }),
        "r" | "receive" => Box::new(Receive {
            name: sarg(args, 0),
        }),
        "t" | "trigger" => {
            let kinds: Vec<char> = if args.is_empty() {
                vec!['b', 'b']
            } else {
                args.iter()
                    .map(|a| match a {
                        Atom::Float(_) => 'f',
                        Atom::Symbol(s) => s.chars().next().unwrap_or('a'),
                    })
                    .collect()
            };
            if let Some(k) = kinds.iter().find(|k| !"bfslap".contains(**k)) {
                return Err(bad(&format!("unknown trigger type '{k}'")));
            }
            Box::new(Trigger { kinds })
        }
        "pack" => {
            let values = if args.is_empty() {
                vec![Atom::Float(0.0), Atom::Float(0.0)]
            } else {
                args.iter()
                    .map(|a| match a {
                        Atom::Symbol(s) if s == "s" => Atom::Symbol("symbol".into()),
                        Atom::Symbol(_) => Atom::Float(0.0),
                        f => f.clone(),
                    })
                    .collect()
            };
            Box::new(Pack { values })
        }
        "unpack" => Box::new(Unpack {
            n: if args.is_empty() { 2 } else { args.len() },
        }),
        "route" => Box::new(Route {
            keys: if args.is_empty() {
                vec![Atom::Float(0.0)]
            } else {
                args.to_vec()
            },
        }),
        "sel" | "select" => Box::new(Select {
            keys: if args.is_empty() {
                vec![Atom::Float(0.0)]
            } else {
                args.to_vec()
            },
        }),
        "mtof" => Box::new(Mtof),
        "print" => Box::new(Print {
            name: if args.is_empty() {
                "print".into()
            } else {
                sarg(args, 0)
            },
        }),
        "bang" | "b" => Box::new(Pass {
            bang: true,
            inlets: 1,
        }),
        "inlet" => Box::new(Pass {
            bang: false,
            inlets: 1,
        }),
        "outlet" => Box::new(Pass {
            bang: false,
            inlets: 1,
        }),
        _ => return Ok(None),
    }))
}

/// A number box (`#X floatatom`): passes what it gets.
pub fn atom_box() -> Box<dyn PdObject> {
    Box::new(Pass {
        bang: false,
        inlets: 1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn print_posts_what_pd_posts() {
        let f = |x: f32| Atom::Float(x);
        let s = |x: &str| Atom::Symbol(x.into());
        assert_eq!(print_line("p", &Msg::from_atoms(vec![f(0.5)])), "p: 0.5");
        assert_eq!(
            print_line("p", &Msg::from_atoms(vec![f(1.0), s("a")])),
            "p: 1 a"
        );
        assert_eq!(
            print_line("p", &Msg::from_atoms(vec![s("set"), f(2.0)])),
            "p: set 2"
        );
        assert_eq!(print_line("p", &Msg::bang()), "p: bang");
        assert_eq!(
            print_line(
                "p",
                &Msg {
                    selector: "list".into(),
                    args: vec![s("a"), s("b")]
                }
            ),
            "p: list a b"
        );
        assert_eq!(
            print_line(
                "p",
                &Msg {
                    selector: "symbol".into(),
                    args: vec![s("x")]
                }
            ),
            "p: symbol x"
        );
    }
}
