//! The `.pd` file format: records separated by unescaped `;`, atoms separated by white space,
//! `\;` `\,` `\$` escapes (Pd's `binbuf_text`, m_binbuf.c).
//!
//! A patch file is a tree of canvases: `#N canvas ...;` opens one, `#X restore x y pd NAME;`
//! (or `... graph;`) closes it and is itself a box of the parent. Every `#X obj`, `#X msg`,
//! `#X text`, `#X floatatom`, `#X symbolatom` and `#X restore` is a box; `#X connect A O B I`
//! names boxes by their index in that list (comments count).

use crate::atom::Atom;
use std::path::{Path, PathBuf};

/// One token of a record: an atom, or the separators a message box keeps.
#[derive(Debug, Clone, PartialEq)]
pub enum Token {
    /// A float or a symbol.
    Atom(Atom),
    /// `\,` inside a box: separates messages.
    Comma,
    /// `\;` inside a box: starts a message to a named receiver.
    Semi,
    /// `$N` (escaped `\$N` in files): the Nth argument; text around it stays (`$0-foo`).
    Dollar(String),
}

/// A box on a canvas.
#[derive(Debug, Clone)]
pub struct BoxSpec {
    /// What it is.
    pub kind: BoxKind,
    /// Its text after the position (`osc~ 440`, a message's contents...).
    pub tokens: Vec<Token>,
    /// x position (sorts a subpatch's inlets and outlets left to right).
    pub x: f64,
    /// Line in the file where the record starts (1-based).
    pub line: usize,
}

/// The kinds of boxes.
#[derive(Debug, Clone)]
pub enum BoxKind {
    /// `#X obj`.
    Object,
    /// `#X msg`.
    Message,
    /// `#X text`: a comment (counts as a box for `connect`).
    Comment,
    /// `#X floatatom` / `#X symbolatom`: a number box (passes what it gets through).
    Atom,
    /// A subpatch or graph (`#X restore`).
    Canvas(Box<CanvasSpec>),
}

/// An array defined in a graph (`#X array NAME SIZE float FLAGS` plus `#A` data).
#[derive(Debug, Clone)]
pub struct ArraySpec {
    /// Its name (may contain `$0`).
    pub name: Vec<Token>,
    /// Its size in points.
    pub size: usize,
    /// Saved contents, if the patch keeps them.
    pub data: Vec<f32>,
}

/// A canvas: its boxes, connections, and arrays.
#[derive(Debug, Clone, Default)]
pub struct CanvasSpec {
    /// The boxes in file order.
    pub boxes: Vec<BoxSpec>,
    /// `(from box, outlet, to box, inlet)`.
    pub connections: Vec<(usize, usize, usize, usize)>,
    /// Arrays drawn in this canvas (graphs).
    pub arrays: Vec<ArraySpec>,
}

/// A parse error, naming the file and line.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The text is not a valid patch.
    #[error("{path}:{line}: {what}")]
    Syntax {
        /// The file.
        path: PathBuf,
        /// The line the record starts on.
        line: usize,
        /// What is wrong.
        what: String,
    },
}

/// Reads and parses a patch file.
pub fn parse_file(path: &Path) -> Result<CanvasSpec, ParseError> {
    let text = std::fs::read_to_string(path).map_err(|source| ParseError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_str(&text, path)
}

/// Splits text into records (each with its start line) of raw tokens.
fn records(text: &str) -> Vec<(usize, Vec<Token>)> {
    let mut out = Vec::new();
    let mut cur: Vec<Token> = Vec::new();
    let mut word = String::new();
    let mut word_escaped_dollar = false;
    let mut word_has_dollar = false;
    let mut line = 1usize;
    let mut rec_line = 0usize;
    let mut chars = text.chars().peekable();
    let flush = |word: &mut String, dollar: &mut bool, esc: &mut bool, cur: &mut Vec<Token>| {
        if !word.is_empty() {
            if *dollar {
                cur.push(Token::Dollar(std::mem::take(word)));
            } else {
                cur.push(Token::Atom(Atom::parse(word, *esc)));
                word.clear();
            }
        }
        *dollar = false;
        *esc = false;
    };
    while let Some(c) = chars.next() {
        if rec_line == 0 && !c.is_whitespace() {
            rec_line = line;
        }
        match c {
            '\\' => {
                if let Some(&n) = chars.peek() {
                    chars.next();
                    match n {
                        ';' if word.is_empty() => cur.push(Token::Semi),
                        ',' if word.is_empty() => cur.push(Token::Comma),
                        '$' => {
                            word.push('$');
                            word_has_dollar = true;
                        }
                        '\n' => line += 1,
                        other => {
                            word.push(other);
                            word_escaped_dollar = true;
                        }
                    }
                }
            }
            '$' => {
                word.push('$');
                word_has_dollar = true;
            }
            ';' => {
                flush(
                    &mut word,
                    &mut word_has_dollar,
                    &mut word_escaped_dollar,
                    &mut cur,
                );
                out.push((rec_line.max(1), std::mem::take(&mut cur)));
                rec_line = 0;
            }
            ',' => {
                flush(
                    &mut word,
                    &mut word_has_dollar,
                    &mut word_escaped_dollar,
                    &mut cur,
                );
                cur.push(Token::Comma);
            }
            c if c.is_whitespace() => {
                if c == '\n' {
                    line += 1;
                }
                flush(
                    &mut word,
                    &mut word_has_dollar,
                    &mut word_escaped_dollar,
                    &mut cur,
                );
            }
            c => word.push(c),
        }
    }
    flush(
        &mut word,
        &mut word_has_dollar,
        &mut word_escaped_dollar,
        &mut cur,
    );
    if !cur.is_empty() {
        out.push((rec_line.max(1), cur));
    }
    out
}

fn sym(t: &Token) -> Option<&str> {
    match t {
        Token::Atom(Atom::Symbol(s)) => Some(s),
        _ => None,
    }
}

fn num(t: Option<&Token>) -> f64 {
    match t {
        Some(Token::Atom(Atom::Float(f))) => *f as f64,
        _ => 0.0,
    }
}

/// Parses patch text; `path` is only used in error messages.
pub fn parse_str(text: &str, path: &Path) -> Result<CanvasSpec, ParseError> {
    let err = |line: usize, what: String| ParseError::Syntax {
        path: path.to_path_buf(),
        line,
        what,
    };
    let mut stack: Vec<CanvasSpec> = Vec::new();
    let mut root: Option<CanvasSpec> = None;
    for (line, rec) in records(text) {
        if rec.is_empty() {
            continue;
        }
        let head = sym(&rec[0]).unwrap_or("");
        let kind = rec.get(1).and_then(sym).unwrap_or("");
        match (head, kind) {
            ("#N", "canvas") => stack.push(CanvasSpec::default()),
            ("#N", _) => {} // #N struct etc.: data structures are not supported, ignored
            ("#X", "restore") => {
                let done = stack
                    .pop()
                    .ok_or_else(|| err(line, "#X restore without an open canvas".into()))?;
                let parent = stack
                    .last_mut()
                    .ok_or_else(|| err(line, "#X restore closes the top canvas".into()))?;
                parent.boxes.push(BoxSpec {
                    kind: BoxKind::Canvas(Box::new(done)),
                    tokens: rec[4..].to_vec(),
                    x: num(rec.get(2)),
                    line,
                });
            }
            ("#X", "obj" | "msg" | "text" | "floatatom" | "symbolatom" | "listbox") => {
                let canvas = stack
                    .last_mut()
                    .ok_or_else(|| err(line, format!("#X {kind} outside a canvas")))?;
                let kind_enum = match kind {
                    "obj" => BoxKind::Object,
                    "msg" => BoxKind::Message,
                    "text" => BoxKind::Comment,
                    _ => BoxKind::Atom,
                };
                canvas.boxes.push(BoxSpec {
                    kind: kind_enum,
                    tokens: rec.get(4..).map(<[Token]>::to_vec).unwrap_or_default(),
                    x: num(rec.get(2)),
                    line,
                });
            }
            ("#X", "connect") => {
                let canvas = stack
                    .last_mut()
                    .ok_or_else(|| err(line, "#X connect outside a canvas".into()))?;
                let n: Vec<usize> = rec[2..]
                    .iter()
                    .map(|t| match t {
                        Token::Atom(Atom::Float(f)) if *f >= 0.0 => Ok(*f as usize),
                        _ => Err(err(line, "#X connect takes four numbers".into())),
                    })
                    .collect::<Result<_, _>>()?;
                if n.len() != 4 {
                    return Err(err(line, "#X connect takes four numbers".into()));
                }
                canvas.connections.push((n[0], n[1], n[2], n[3]));
            }
            ("#X", "array") => {
                let canvas = stack
                    .last_mut()
                    .ok_or_else(|| err(line, "#X array outside a canvas".into()))?;
                let name = rec.get(2).cloned().into_iter().collect();
                let size = num(rec.get(3)).max(1.0) as usize;
                canvas.arrays.push(ArraySpec {
                    name,
                    size,
                    data: Vec::new(),
                });
            }
            ("#A", _) => {
                // `#A ONSET v v v ...`: saved array contents for the last #X array.
                let canvas = stack
                    .last_mut()
                    .ok_or_else(|| err(line, "#A outside a canvas".into()))?;
                let arr = canvas
                    .arrays
                    .last_mut()
                    .ok_or_else(|| err(line, "#A without #X array".into()))?;
                let onset = num(rec.get(1)) as usize;
                let vals: Vec<f32> = rec[2..].iter().map(|t| num(Some(t)) as f32).collect();
                if arr.data.len() < arr.size {
                    arr.data.resize(arr.size, 0.0);
                }
                for (i, v) in vals.into_iter().enumerate() {
                    if onset + i < arr.data.len() {
                        arr.data[onset + i] = v;
                    }
                }
            }
            ("#X", "coords" | "f" | "declare" | "scalar") | ("#C", _) => {}
            ("#X", other) => return Err(err(line, format!("unknown record '#X {other}'"))),
            (h, _) => return Err(err(line, format!("unknown record head '{h}'"))),
        }
        if stack.len() == 1 && root.is_none() {
            // keep going; root is taken at the end
        }
    }
    if stack.len() != 1 {
        return Err(err(
            1,
            format!(
                "unbalanced canvases: {} still open at the end of the file",
                stack.len()
            ),
        ));
    }
    root = stack.pop();
    Ok(root.expect("one canvas"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_boxes_connections_and_escapes() {
        let text = "#N canvas 0 0 450 300 12;\n#X obj 10 10 osc~ 440;\n#X msg 10 40 1 \\, 2 \\; foo 3 \\$1;\n#X text 5 5 hi there;\n#X connect 0 0 1 0;\n";
        let c = parse_str(text, Path::new("t.pd")).unwrap();
        assert_eq!(c.boxes.len(), 3);
        assert_eq!(c.connections, vec![(0, 0, 1, 0)]);
        assert_eq!(c.boxes[1].line, 3);
        let t = &c.boxes[1].tokens;
        assert_eq!(t[1], Token::Comma);
        assert_eq!(t[3], Token::Semi);
        assert_eq!(t[6], Token::Dollar("$1".into()));
    }

    #[test]
    fn subpatches_and_arrays() {
        let text = "#N canvas 0 0 450 300 12;\n#N canvas 0 0 450 300 sub 0;\n#X obj 1 1 inlet~;\n#X restore 10 10 pd sub;\n#N canvas 0 0 450 300 (subpatch) 0;\n#X array tab 4 float 2;\n#A 0 1 2 3 4;\n#X coords 0 1 4 -1 200 140 1;\n#X restore 20 20 graph;\n";
        let c = parse_str(text, Path::new("t.pd")).unwrap();
        assert_eq!(c.boxes.len(), 2);
        let BoxKind::Canvas(g) = &c.boxes[1].kind else {
            panic!("graph")
        };
        assert_eq!(g.arrays[0].data, vec![1.0, 2.0, 3.0, 4.0]);
    }

    #[test]
    fn unbalanced_is_an_error_with_the_file() {
        let e = parse_str(
            "#N canvas 0 0 1 1 12;\n#N canvas 0 0 1 1 s 0;\n",
            Path::new("x.pd"),
        )
        .unwrap_err();
        assert!(e.to_string().contains("x.pd"), "{e}");
    }
}
