//! Pd 0.53's DSP sort (d_ugen.c `ugen_done_graph`), per canvas, subcanvases expanded in place.
//!
//! Pd keeps each canvas's DSP objects in a list built by prepending (so the reverse of box
//! order), and each outlet's connections also prepended. It walks the list; an object with no
//! connected signal inlet is scheduled, and scheduling an object passes its outputs on: an
//! object whose last connected inlet has just been fed is scheduled at once (depth first).
//! The order matters where objects share state without a wire: a `delread~` sorted after its
//! `delwrite~` has no extra block of delay, a `catch~` before a `throw~` hears it a block late.

use crate::load::{SortCanvas, SortItem};
use std::collections::HashMap;

/// A DSP loop (objects that could not be sorted).
#[derive(Debug, thiserror::Error)]
#[error("DSP loop detected (some signal objects could not be scheduled): objects {0:?}")]
pub struct DspLoop(pub Vec<usize>);

/// Sorts the program's DSP objects; returns flat object ids in execution order.
pub fn sort(
    top: &SortCanvas,
    edges: &[(usize, usize, usize, usize)],
) -> Result<Vec<usize>, DspLoop> {
    let mut out = Vec::new();
    sort_canvas(top, edges, &mut out)?;
    Ok(out)
}

fn sort_canvas(
    c: &SortCanvas,
    edges: &[(usize, usize, usize, usize)],
    out: &mut Vec<usize>,
) -> Result<(), DspLoop> {
    let n = c.items.len();
    // which item a flat id belongs to at this level (as a source or a target)
    let mut as_src: HashMap<usize, (usize, usize)> = HashMap::new(); // id -> (item, outlet key)
    let mut as_dst: HashMap<usize, usize> = HashMap::new();
    for (k, it) in c.items.iter().enumerate() {
        match it {
            SortItem::Obj(id) => {
                as_src.insert(*id, (k, 0));
                as_dst.insert(*id, k);
            }
            SortItem::Sub {
                inlets, outlets, ..
            } => {
                for &i in inlets {
                    as_dst.insert(i, k);
                }
                for (j, &o) in outlets.iter().enumerate() {
                    as_src.insert(o, (k, j));
                }
            }
        }
    }
    let mut nconnect = vec![0usize; n];
    // per item: (outlet key, file order, target item)
    let mut outgoing: Vec<Vec<(usize, usize, usize)>> = vec![Vec::new(); n];
    for (order, &e) in c.edges.iter().enumerate() {
        let (src, outlet, dst, _) = edges[e];
        let (Some(&(si, key)), Some(&di)) = (as_src.get(&src), as_dst.get(&dst)) else {
            continue;
        };
        let key = if matches!(c.items[si], SortItem::Obj(_)) {
            outlet
        } else {
            key
        };
        nconnect[di] += 1;
        outgoing[si].push((key, order, di));
    }
    for o in &mut outgoing {
        // outlets in order; within an outlet, connections newest first (prepended)
        o.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    }
    let mut ngot = vec![0usize; n];
    let mut done = vec![false; n];
    let mut st = State {
        c,
        edges,
        outgoing: &outgoing,
        nconnect: &nconnect,
        ngot: &mut ngot,
        done: &mut done,
    };
    for k in (0..n).rev() {
        if st.done[k] || nconnect[k] > 0 {
            continue;
        }
        st.doit(k, out)?;
    }
    let missing: Vec<usize> = (0..n)
        .filter(|&k| !st.done[k])
        .filter_map(|k| match &c.items[k] {
            SortItem::Obj(id) => Some(*id),
            SortItem::Sub { inlets, .. } => inlets.first().copied(),
        })
        .collect();
    if !missing.is_empty() {
        return Err(DspLoop(missing));
    }
    Ok(())
}

struct State<'a> {
    c: &'a SortCanvas,
    edges: &'a [(usize, usize, usize, usize)],
    outgoing: &'a [Vec<(usize, usize, usize)>],
    nconnect: &'a [usize],
    ngot: &'a mut [usize],
    done: &'a mut [bool],
}

impl State<'_> {
    fn doit(&mut self, k: usize, out: &mut Vec<usize>) -> Result<(), DspLoop> {
        match &self.c.items[k] {
            SortItem::Obj(id) => out.push(*id),
            SortItem::Sub { canvas, .. } => sort_canvas(canvas, self.edges, out)?,
        }
        for &(_, _, d) in &self.outgoing[k] {
            self.ngot[d] += 1;
            if self.ngot[d] == self.nconnect[d] && !self.done[d] {
                self.doit(d, out)?;
            }
        }
        self.done[k] = true;
        Ok(())
    }
}
