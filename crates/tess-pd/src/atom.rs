//! Pd's atoms and messages (m_pd.h `t_atom`), and `$N` substitution (m_binbuf.c).

use std::fmt;

/// A float or a symbol.
#[derive(Debug, Clone, PartialEq)]
pub enum Atom {
    /// A number (Pd's `t_float`, 32-bit in Debian's build).
    Float(f32),
    /// A symbol.
    Symbol(String),
}

impl Atom {
    /// Reads one word of patch text as Pd's `binbuf_text` does: a number if it looks like
    /// one and was not escaped, else a symbol.
    pub fn parse(word: &str, escaped: bool) -> Atom {
        let first = word.chars().next().unwrap_or(' ');
        if !escaped && (first.is_ascii_digit() || matches!(first, '-' | '+' | '.')) {
            if let Ok(f) = word.parse::<f64>() {
                return Atom::Float(f as f32);
            }
        }
        Atom::Symbol(word.to_string())
    }

    /// The float, or 0 for a symbol (Pd's `atom_getfloat`).
    pub fn float(&self) -> f32 {
        match self {
            Atom::Float(f) => *f,
            Atom::Symbol(_) => 0.0,
        }
    }

    /// The symbol text, if a symbol.
    pub fn symbol(&self) -> Option<&str> {
        match self {
            Atom::Symbol(s) => Some(s),
            Atom::Float(_) => None,
        }
    }
}

impl fmt::Display for Atom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Atom::Float(v) => write!(f, "{v}"),
            Atom::Symbol(s) => write!(f, "{s}"),
        }
    }
}

/// A message: a selector and arguments (`float 3`, `list 1 2`, `set foo`, `bang`).
#[derive(Debug, Clone, PartialEq)]
pub struct Msg {
    /// The selector (`bang`, `float`, `symbol`, `list`, or any other word).
    pub selector: String,
    /// The arguments.
    pub args: Vec<Atom>,
}

impl Msg {
    /// `bang`.
    pub fn bang() -> Msg {
        Msg {
            selector: "bang".into(),
            args: vec![],
        }
    }
    /// `float F`.
    pub fn float(f: f32) -> Msg {
        Msg {
            selector: "float".into(),
            args: vec![Atom::Float(f)],
        }
    }
    /// `symbol S`.
    pub fn symbol(s: &str) -> Msg {
        Msg {
            selector: "symbol".into(),
            args: vec![Atom::Symbol(s.into())],
        }
    }
    /// Builds the message a list of atoms means (Pd's `outlet_list` / message box rules): a
    /// leading float makes `float` (one atom) or `list`; a leading symbol is the selector.
    pub fn from_atoms(atoms: Vec<Atom>) -> Msg {
        match atoms.first() {
            None => Msg::bang(),
            Some(Atom::Float(_)) if atoms.len() == 1 => Msg {
                selector: "float".into(),
                args: atoms,
            },
            Some(Atom::Float(_)) => Msg {
                selector: "list".into(),
                args: atoms,
            },
            Some(Atom::Symbol(s)) => {
                let sel = s.clone();
                Msg {
                    selector: sel,
                    args: atoms[1..].to_vec(),
                }
            }
        }
    }
    /// The message as a list of atoms (what `$1`... refer to in a message box).
    pub fn as_list(&self) -> Vec<Atom> {
        match self.selector.as_str() {
            "float" | "list" | "symbol" | "bang" => self.args.clone(),
            s => {
                let mut v = vec![Atom::Symbol(s.to_string())];
                v.extend(self.args.iter().cloned());
                v
            }
        }
    }
    /// The first argument as a float (0 if none).
    pub fn f(&self, i: usize) -> f32 {
        self.args.get(i).map(Atom::float).unwrap_or(0.0)
    }
}

/// Replaces `$N` in `text` from `args` (1-based; `$0` is `dollar_zero`). A word that is
/// exactly `$N` with N a float argument becomes that float; anything else a symbol.
pub fn substitute(text: &str, args: &[Atom], dollar_zero: u32) -> Option<Atom> {
    let arg_of = |n: usize| -> Option<Atom> {
        if n == 0 {
            Some(Atom::Float(dollar_zero as f32))
        } else {
            args.get(n - 1).cloned()
        }
    };
    // a whole-word `$N`
    if let Some(rest) = text.strip_prefix('$') {
        if !rest.is_empty() && rest.chars().all(|c| c.is_ascii_digit()) {
            return arg_of(rest.parse().ok()?).or(Some(Atom::Float(0.0)));
        }
    }
    let mut out = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '$' {
            let mut digits = String::new();
            while let Some(d) = chars.peek().copied().filter(char::is_ascii_digit) {
                digits.push(d);
                chars.next();
            }
            if digits.is_empty() {
                out.push('$');
            } else {
                match arg_of(digits.parse().unwrap_or(0)) {
                    Some(a) => out.push_str(&a.to_string()),
                    None => out.push('0'),
                }
            }
        } else {
            out.push(c);
        }
    }
    Some(Atom::parse(&out, true))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dollars() {
        let a = [Atom::Float(3.0), Atom::Symbol("x".into())];
        assert_eq!(substitute("$1", &a, 1001), Some(Atom::Float(3.0)));
        assert_eq!(
            substitute("$0-buf", &a, 1001),
            Some(Atom::Symbol("1001-buf".into()))
        );
        assert_eq!(substitute("$2", &a, 1), Some(Atom::Symbol("x".into())));
    }

    #[test]
    fn atoms_make_messages() {
        assert_eq!(Msg::from_atoms(vec![Atom::Float(1.0)]).selector, "float");
        let m = Msg::from_atoms(vec![Atom::Symbol("set".into()), Atom::Float(2.0)]);
        assert_eq!(m.selector, "set");
        assert_eq!(m.args, vec![Atom::Float(2.0)]);
    }
}
