//! Loading a patch: parse the file, create every object (abstractions from the patch's folder
//! with `$N` arguments, `$0` unique per canvas instance), and flatten subpatches into one list
//! of objects with control and signal edges. A subpatch's ports become pass-through objects
//! (`inlet`, `inlet~`, ...), ordered left to right by x position as Pd orders them.
//!
//! The canvas tree is kept ([`SortCanvas`]) because Pd sorts DSP per canvas: a subpatch is one
//! unit in its parent's sort, expanded in place (d_ugen.c `ugen_done_graph`).

use crate::atom::{substitute, Atom};
use crate::objects::{self, control, CreateError, PdObject, Port};
use crate::parse::{self, BoxKind, CanvasSpec, Token};
use crate::shared::Shared;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Why a patch could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file is not a valid patch.
    #[error(transparent)]
    Parse(#[from] parse::ParseError),
    /// An object could not be created.
    #[error("{file}:{line}: {source}")]
    Object {
        /// The file.
        file: PathBuf,
        /// The line of the box.
        line: usize,
        /// Why.
        source: CreateError,
    },
    /// A connection names a box or port that does not exist.
    #[error("{file}: bad connection {from} {outlet} -> {to} {inlet}: {what}")]
    Connection {
        /// The file.
        file: PathBuf,
        /// Source box.
        from: usize,
        /// Source outlet.
        outlet: usize,
        /// Target box.
        to: usize,
        /// Target inlet.
        inlet: usize,
        /// What is wrong.
        what: String,
    },
    /// Abstractions nest too deep (a patch that includes itself).
    #[error("{0}: abstractions nested more than 64 deep (does it include itself?)")]
    TooDeep(PathBuf),
}

/// One object of the flattened patch.
#[derive(Debug)]
pub struct ObjEntry {
    /// The object.
    pub obj: Box<dyn PdObject>,
    /// Its class (`osc~`, `msg`...).
    pub class: String,
    /// Where it was defined.
    pub file: PathBuf,
    /// Line of its box.
    pub line: usize,
    /// Inlets.
    pub ins: Vec<Port>,
    /// Outlets.
    pub outs: Vec<Port>,
    /// Named state it touches in DSP (delay line, bus, dac), if any.
    pub resource: Option<String>,
    /// The name it receives on (`r NAME`).
    pub receives: Option<String>,
}

/// A canvas for Pd's DSP sort: its DSP objects and subcanvases in box order, and the signal
/// edges drawn on it (indices into [`Program::signal_edges`]).
#[derive(Debug, Default)]
pub struct SortCanvas {
    /// Items in box order.
    pub items: Vec<SortItem>,
    /// Signal edges drawn on this canvas, in file order.
    pub edges: Vec<usize>,
}

/// An item of a [`SortCanvas`].
#[derive(Debug)]
pub enum SortItem {
    /// A DSP object (flat id).
    Obj(usize),
    /// A subcanvas with its signal inlet~/outlet~ objects (flat ids, left to right).
    Sub {
        /// The subcanvas.
        canvas: SortCanvas,
        /// Its `inlet~` objects.
        inlets: Vec<usize>,
        /// Its `outlet~` objects.
        outlets: Vec<usize>,
    },
}

/// A loaded, flattened patch.
#[derive(Debug)]
pub struct Program {
    /// All objects.
    pub objects: Vec<ObjEntry>,
    /// Control edges: `control_out[obj][outlet]` = targets `(obj, inlet)` in creation order.
    pub control_out: Vec<Vec<Vec<(usize, usize)>>>,
    /// Signal edges `(from obj, outlet, to obj, inlet)` (port indices).
    pub signal_edges: Vec<(usize, usize, usize, usize)>,
    /// The top canvas for sorting.
    pub sort: SortCanvas,
    /// Named state.
    pub shared: Shared,
    /// Objects in Pd's loadbang order.
    pub loadbang_order: Vec<usize>,
}

/// How a box of a canvas maps to flat objects.
#[derive(Debug, Clone)]
enum BoxRef {
    None,
    Obj(usize),
    Canvas {
        inlets: Vec<usize>,
        outlets: Vec<usize>,
    },
}

struct Loader {
    objects: Vec<ObjEntry>,
    control_out: Vec<Vec<Vec<(usize, usize)>>>,
    signal_edges: Vec<(usize, usize, usize, usize)>,
    shared: Shared,
    noise_seed: i32,
    next_dollar_zero: u32,
    abstraction_cache: HashMap<PathBuf, CanvasSpec>,
    /// Loadbang order: (is abstraction level, depth-first list).
    loadbangs: Vec<usize>,
}

/// Loads a patch file.
pub fn load(path: &Path) -> Result<Program, LoadError> {
    let spec = parse::parse_file(path)?;
    let mut l = Loader {
        objects: Vec::new(),
        control_out: Vec::new(),
        signal_edges: Vec::new(),
        shared: Shared::default(),
        noise_seed: 307,
        next_dollar_zero: 1000,
        abstraction_cache: HashMap::new(),
        loadbangs: Vec::new(),
    };
    let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
    let (sort, _, _) = l.canvas(&spec, path, &dir, &[], None, 0)?;
    // An array is ordered state only where a `tabwrite~` writes it in DSP; readers of the
    // others (64 voices on one wavetable) stay free to run in parallel.
    let written: std::collections::HashSet<String> = l
        .objects
        .iter()
        .filter(|e| e.class == "tabwrite~")
        .filter_map(|e| e.resource.clone())
        .collect();
    for e in &mut l.objects {
        if e.resource
            .as_ref()
            .is_some_and(|r| r.starts_with("array:") && !written.contains(r))
        {
            e.resource = None;
        }
    }
    Ok(Program {
        objects: l.objects,
        control_out: l.control_out,
        signal_edges: l.signal_edges,
        sort,
        shared: l.shared,
        loadbang_order: l.loadbangs,
    })
}

fn token_atom(t: &Token, args: &[Atom], dz: u32) -> Option<Atom> {
    match t {
        Token::Atom(a) => Some(a.clone()),
        Token::Dollar(d) => substitute(d, args, dz),
        _ => None,
    }
}

impl Loader {
    fn add(&mut self, mut e: ObjEntry) -> usize {
        let (ins, outs) = e.obj.ports();
        e.ins = ins;
        e.outs = outs;
        self.control_out.push(vec![Vec::new(); e.outs.len()]);
        self.objects.push(e);
        self.objects.len() - 1
    }

    /// Loads one canvas; returns its sort tree and its port objects (inlets, outlets) sorted
    /// by x.
    fn canvas(
        &mut self,
        spec: &CanvasSpec,
        file: &Path,
        dir: &Path,
        args: &[Atom],
        dollar_zero: Option<u32>,
        depth: usize,
    ) -> Result<(SortCanvas, Vec<usize>, Vec<usize>), LoadError> {
        if depth > 64 {
            return Err(LoadError::TooDeep(file.to_path_buf()));
        }
        let dz = match dollar_zero {
            Some(d) => d,
            None => {
                self.next_dollar_zero += 1;
                self.next_dollar_zero
            }
        };
        for arr in &spec.arrays {
            let name = arr
                .name
                .first()
                .and_then(|t| token_atom(t, args, dz))
                .map(|a| a.to_string())
                .unwrap_or_default();
            let mut data = arr.data.clone();
            data.resize(arr.size, 0.0);
            objects::array::define_array(&mut self.shared, &name, data);
        }
        let mut refs = Vec::with_capacity(spec.boxes.len());
        let mut sort = SortCanvas::default();
        let mut ports_in: Vec<(f64, usize)> = Vec::new();
        let mut ports_out: Vec<(f64, usize)> = Vec::new();
        let mut own_loadbangs = Vec::new();
        for b in &spec.boxes {
            let entry = |obj: Box<dyn PdObject>, class: &str| ObjEntry {
                obj,
                class: class.to_string(),
                file: file.to_path_buf(),
                line: b.line,
                ins: vec![],
                outs: vec![],
                resource: None,
                receives: None,
            };
            match &b.kind {
                BoxKind::Comment => refs.push(BoxRef::None),
                BoxKind::Message => {
                    // `$1` in a message box refers to the incoming message; keep it as is.
                    let id = self.add(entry(
                        Box::new(control::MsgBox::new(b.tokens.clone())),
                        "msg",
                    ));
                    refs.push(BoxRef::Obj(id));
                }
                BoxKind::Atom => {
                    let id = self.add(entry(control::atom_box(), "floatatom"));
                    refs.push(BoxRef::Obj(id));
                }
                BoxKind::Canvas(sub) => {
                    let (sc, ins, outs) = self.canvas(sub, file, dir, args, Some(dz), depth + 1)?;
                    let sig_in = ins
                        .iter()
                        .copied()
                        .filter(|&i| self.objects[i].class == "inlet~")
                        .collect();
                    let sig_out = outs
                        .iter()
                        .copied()
                        .filter(|&i| self.objects[i].class == "outlet~")
                        .collect();
                    sort.items.push(SortItem::Sub {
                        canvas: sc,
                        inlets: sig_in,
                        outlets: sig_out,
                    });
                    refs.push(BoxRef::Canvas {
                        inlets: ins,
                        outlets: outs,
                    });
                }
                BoxKind::Object => {
                    // Pd hands an object its `\,` and `\;` as separator atoms; expr's text needs
                    // them (function arguments, one outlet per expression), others drop them.
                    let is_expr = matches!(
                        b.tokens.first(),
                        Some(Token::Atom(Atom::Symbol(s))) if s == "expr" || s == "expr~"
                    );
                    let atoms: Vec<Atom> = b
                        .tokens
                        .iter()
                        .filter_map(|t| match t {
                            Token::Comma if is_expr => Some(Atom::Symbol(",".into())),
                            Token::Semi if is_expr => Some(Atom::Symbol(";".into())),
                            t => token_atom(t, args, dz),
                        })
                        .collect();
                    let Some(class) = atoms.first().map(|a| a.to_string()) else {
                        refs.push(BoxRef::None); // an empty box: Pd keeps it as text
                        continue;
                    };
                    let cargs = &atoms[1..];
                    match objects::create(
                        class.as_str(),
                        cargs,
                        &mut self.shared,
                        &mut self.noise_seed,
                        dir,
                    ) {
                        Ok(obj) => {
                            let mut e = entry(obj, &class);
                            e.resource = objects::delay::resource(&class, cargs)
                                .or_else(|| objects::global::resource(&class, cargs))
                                .or_else(|| objects::array::resource(&class, cargs));
                            if matches!(class.as_str(), "r" | "receive") {
                                e.receives = Some(objects::sarg(cargs, 0));
                            }
                            if let Some(name) = objects::midi::receive_name(&class) {
                                e.receives = Some(name.to_string());
                            }
                            let is_dsp = e.obj.is_dsp();
                            let id = self.add(e);
                            match class.as_str() {
                                "inlet" | "inlet~" => ports_in.push((b.x, id)),
                                "outlet" | "outlet~" => ports_out.push((b.x, id)),
                                "loadbang" => own_loadbangs.push(id),
                                _ => {}
                            }
                            if is_dsp {
                                sort.items.push(SortItem::Obj(id));
                            }
                            refs.push(BoxRef::Obj(id));
                        }
                        Err(CreateError::Unknown(_)) => {
                            let abs = dir.join(format!("{class}.pd"));
                            if !abs.is_file() {
                                return Err(LoadError::Object {
                                    file: file.to_path_buf(),
                                    line: b.line,
                                    source: CreateError::Unknown(class),
                                });
                            }
                            let sub = match self.abstraction_cache.get(&abs) {
                                Some(s) => s.clone(),
                                None => {
                                    let s = parse::parse_file(&abs)?;
                                    self.abstraction_cache.insert(abs.clone(), s.clone());
                                    s
                                }
                            };
                            let (sc, ins, outs) =
                                self.canvas(&sub, &abs, dir, cargs, None, depth + 1)?;
                            let sig_in = ins
                                .iter()
                                .copied()
                                .filter(|&i| self.objects[i].class == "inlet~")
                                .collect();
                            let sig_out = outs
                                .iter()
                                .copied()
                                .filter(|&i| self.objects[i].class == "outlet~")
                                .collect();
                            sort.items.push(SortItem::Sub {
                                canvas: sc,
                                inlets: sig_in,
                                outlets: sig_out,
                            });
                            refs.push(BoxRef::Canvas {
                                inlets: ins,
                                outlets: outs,
                            });
                        }
                        Err(source) => {
                            return Err(LoadError::Object {
                                file: file.to_path_buf(),
                                line: b.line,
                                source,
                            })
                        }
                    }
                }
            }
        }
        self.loadbangs.extend(own_loadbangs);
        for &(a, o, bx, i) in &spec.connections {
            let bad = |what: &str| LoadError::Connection {
                file: file.to_path_buf(),
                from: a,
                outlet: o,
                to: bx,
                inlet: i,
                what: what.to_string(),
            };
            let src = match refs.get(a) {
                Some(BoxRef::Obj(id)) => (*id, o),
                Some(BoxRef::Canvas { outlets, .. }) => (
                    *outlets
                        .get(o)
                        .ok_or_else(|| bad("no such subpatch outlet"))?,
                    0,
                ),
                _ => return Err(bad("no such box")),
            };
            let dst = match refs.get(bx) {
                Some(BoxRef::Obj(id)) => (*id, i),
                Some(BoxRef::Canvas { inlets, .. }) => (
                    *inlets.get(i).ok_or_else(|| bad("no such subpatch inlet"))?,
                    0,
                ),
                _ => return Err(bad("no such box")),
            };
            let out_kind = *self.objects[src.0]
                .outs
                .get(src.1)
                .ok_or_else(|| bad("no such outlet"))?;
            let in_kind = *self.objects[dst.0]
                .ins
                .get(dst.1)
                .ok_or_else(|| bad("no such inlet"))?;
            match (out_kind, in_kind) {
                (Port::Signal, Port::Signal) => {
                    self.signal_edges.push((src.0, src.1, dst.0, dst.1));
                    sort.edges.push(self.signal_edges.len() - 1);
                }
                (Port::Signal, Port::Control) => {
                    return Err(bad("signal outlet connected to a control inlet"))
                }
                (Port::Control, _) => self.control_out[src.0][src.1].push(dst),
            }
        }
        ports_in.sort_by(|a, b| a.0.total_cmp(&b.0));
        ports_out.sort_by(|a, b| a.0.total_cmp(&b.0));
        Ok((
            sort,
            ports_in.into_iter().map(|p| p.1).collect(),
            ports_out.into_iter().map(|p| p.1).collect(),
        ))
    }
}
