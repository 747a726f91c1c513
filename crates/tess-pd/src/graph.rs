//! The DSP graph: one node per signal object in Pd's sort order, its input wiring, and its
//! buffers; plus the dependency edges the parallel scheduler must respect.
//!
//! Dependencies are (1) signal wires and (2) Pd's sort order among objects that touch the
//! same named state (a delay line, a `send~`/`catch~` bus, the `dac~` channels): those run
//! one after the other in exactly Pd's order, so their results match Pd's even on many harts.
//!
//! # Concurrency
//! Each node's object and buffers sit in [`UnsafeCell`]s. A node is run only by the one
//! worker that took it from a queue, after every predecessor finished (its dependency count
//! reached zero with acquire ordering); it writes only its own buffers and reads only its
//! predecessors' output buffers, which nobody writes until the next block.

use crate::load::Program;
use crate::objects::{PdObject, Port};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, Ordering};

/// One signal object, ready to run.
#[derive(Debug)]
pub struct Node {
    /// The flat object id.
    pub obj_id: usize,
    /// For each signal inlet: the sources `(node, signal outlet)` summed into it.
    pub sources: Vec<Vec<(usize, usize)>>,
    /// The object's inlet number of each signal inlet (for unconnected inlets' scalars).
    pub signal_inlet_ports: Vec<usize>,
    /// Nodes that must run before this one.
    pub preds: Vec<usize>,
    /// Nodes that wait for this one.
    pub succs: Vec<usize>,
    /// Relative cost (ns per block, a hint for clustering).
    pub cost_ns: u32,
    obj: UnsafeCell<Box<dyn PdObject>>,
    ins: UnsafeCell<Vec<Vec<f32>>>,
    outs: UnsafeCell<Vec<Vec<f32>>>,
}

// SAFETY: a node's cells are only touched by the one worker running it, with the happens-before
// edges described in the module docs; the object itself is `Send`.
unsafe impl Sync for Node {}

/// The graph.
#[derive(Debug, Default)]
pub struct DspGraph {
    /// Nodes in Pd's order (a valid serial schedule).
    pub nodes: Vec<Node>,
    /// Node of each flat object id (None for control objects).
    pub node_of: Vec<Option<usize>>,
    /// Per node: its object asked for a clock after this block (`wants_clock_after_block`).
    /// Asked on the hart that ran the node, right after `perform`, so that the control pass
    /// after the block reads these flags instead of every object: reading the objects would
    /// pull each one's state from the hart that computes it, and back, on every block.
    fired: Vec<AtomicBool>,
}

impl DspGraph {
    /// Builds the graph, taking the signal objects out of `program` (control objects stay).
    /// `order` is Pd's sort order; `block` the block size.
    pub fn build(
        program: &mut Program,
        order: &[usize],
        block: usize,
        placeholder: impl Fn() -> Box<dyn PdObject>,
    ) -> DspGraph {
        let mut node_of = vec![None; program.objects.len()];
        for (k, &id) in order.iter().enumerate() {
            node_of[id] = Some(k);
        }
        let mut nodes: Vec<Node> = order
            .iter()
            .map(|&id| {
                let e = &mut program.objects[id];
                let n_in = e.ins.iter().filter(|p| **p == Port::Signal).count();
                let n_out = e.outs.iter().filter(|p| **p == Port::Signal).count();
                let obj = std::mem::replace(&mut e.obj, placeholder());
                let signal_inlet_ports = e
                    .ins
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| **p == Port::Signal)
                    .map(|(i, _)| i)
                    .collect();
                Node {
                    obj_id: id,
                    signal_inlet_ports,
                    sources: vec![Vec::new(); n_in],
                    preds: Vec::new(),
                    succs: Vec::new(),
                    cost_ns: obj.cost_hint_ns(),
                    obj: UnsafeCell::new(obj),
                    ins: UnsafeCell::new(vec![vec![0.0; block]; n_in]),
                    outs: UnsafeCell::new(vec![vec![0.0; block]; n_out]),
                }
            })
            .collect();
        let sig_index =
            |ports: &[Port], i: usize| ports[..i].iter().filter(|p| **p == Port::Signal).count();
        let mut edges = Vec::new();
        for &(s, so, d, di) in &program.signal_edges {
            let (Some(sn), Some(dn)) = (node_of[s], node_of[d]) else {
                continue;
            };
            let so = sig_index(&program.objects[s].outs, so);
            let di = sig_index(&program.objects[d].ins, di);
            nodes[dn].sources[di].push((sn, so));
            edges.push((sn, dn));
        }
        // Pd's order among users of the same named state
        let mut last_user: std::collections::HashMap<&str, usize> = Default::default();
        for (k, &id) in order.iter().enumerate() {
            if let Some(r) = program.objects[id].resource.as_deref() {
                if let Some(&prev) = last_user.get(r) {
                    edges.push((prev, k));
                }
                last_user.insert(r, k);
            }
        }
        edges.sort_unstable();
        edges.dedup();
        for (a, b) in edges {
            if a != b {
                nodes[b].preds.push(a);
                nodes[a].succs.push(b);
            }
        }
        let fired = nodes.iter().map(|_| AtomicBool::new(false)).collect();
        DspGraph {
            nodes,
            node_of,
            fired,
        }
    }

    /// Whether node `k`'s object asked for a clock after the last block (and forgets it).
    pub fn take_fired(&self, k: usize) -> bool {
        // Only a flag that is set is written, so the flags' lines stay shared between harts.
        self.fired[k].load(Ordering::Relaxed) && self.fired[k].swap(false, Ordering::Relaxed)
    }

    /// The object of a node, for control messages between blocks.
    pub fn obj_mut(&mut self, node: usize) -> &mut Box<dyn PdObject> {
        self.nodes[node].obj.get_mut()
    }

    /// Runs node `k`: gathers its inputs and calls its perform routine.
    ///
    /// # Safety
    /// No other thread runs `k` or any node that reads or writes what `k` does at the same time:
    /// every predecessor of `k` has finished (and that is visible to this thread), no successor
    /// of `k` has started, and `k` runs once per block.
    pub unsafe fn run_node(&self, k: usize) {
        let node = &self.nodes[k];
        // SAFETY: the caller guarantees exclusive access to node k's cells.
        let (obj, ins, outs) = unsafe {
            (
                &mut *node.obj.get(),
                &mut *node.ins.get(),
                &mut *node.outs.get(),
            )
        };
        // An inlet with one source reads that source's buffer in place, as Pd does; only a
        // scalar (unconnected) inlet or a sum of several sources is written into the node's own
        // input buffer first.
        for (i, srcs) in node.sources.iter().enumerate() {
            let buf = &mut ins[i];
            match srcs.split_first() {
                None => buf.fill(obj.signal_scalar(node.signal_inlet_ports[i])),
                Some((_, [])) => {}
                Some((&(s0, o0), rest)) => {
                    // SAFETY: sources are predecessors, finished; their outputs are not written
                    // until the next block.
                    let first = unsafe { &(&*self.nodes[s0].outs.get())[o0] };
                    buf.copy_from_slice(first);
                    for &(s, o) in rest {
                        // SAFETY: as above.
                        let src = unsafe { &(&*self.nodes[s].outs.get())[o] };
                        for (b, x) in buf.iter_mut().zip(src) {
                            *b += *x;
                        }
                    }
                }
            }
        }
        let view = |i: usize| -> &[f32] {
            match node.sources[i].as_slice() {
                // SAFETY: as above; the source is another node (a node feeding itself is a DSP
                // loop, which `sort` refuses before a graph is built),
                // so this shared borrow does not alias `outs`.
                [(s, o)] => unsafe { &(&*self.nodes[*s].outs.get())[*o] },
                _ => &ins[i],
            }
        };
        // Enough for any object of Pd's set (a `dac~` of the emulator's 10 channels included);
        // only an object with more signal inlets pays an allocation per block.
        const ON_STACK: usize = 16;
        if ins.len() <= ON_STACK {
            let mut views: [&[f32]; ON_STACK] = [&[]; ON_STACK];
            for (i, v) in views.iter_mut().enumerate().take(ins.len()) {
                *v = view(i);
            }
            obj.perform(&views[..ins.len()], outs);
        } else {
            let views: Vec<&[f32]> = (0..ins.len()).map(view).collect();
            obj.perform(&views, outs);
        }
        if obj.wants_clock_after_block() {
            // Read after the block by the thread that ran it, which the block's completion
            // (an acquire of the done count) orders after this store.
            self.fired[k].store(true, Ordering::Relaxed);
        }
    }
}
