//! Prints the mean cost of one convolver per audio block for the plans the bench would choose
//! (all work inline, no deadline): `cargo run --release -p tess-conv --example cost [IR_LEN]`.
use std::time::Instant;
use tess_conv::{Convolver, CostModel, Mode, Objective, Plan, WhenLate};

fn main() {
    let len: usize = std::env::args()
        .nth(1)
        .map_or(524_288, |a| a.parse().expect("IR_LEN"));
    let ir: Vec<f32> = (0..len)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let model = CostModel::measure();
    println!("model: {model:?}");
    for obj in [Objective::MeanLoad, Objective::WorstCallback] {
        let plan = Plan::optimal(32, len, 65536, &model, obj).unwrap();
        let mut c = Convolver::new(&ir, &plan, Mode::Synchronous, WhenLate::Drop).unwrap();
        let blocks = 2 * plan.levels.last().unwrap().size / 32 + 1000;
        let x = [0.25f32; 32];
        let mut y = [0.0f32; 32];
        let mut worst = 0.0f64;
        let t = Instant::now();
        for _ in 0..blocks {
            let t1 = Instant::now();
            c.process(&x, &mut y);
            worst = worst.max(t1.elapsed().as_secs_f64());
        }
        let mean_us = t.elapsed().as_secs_f64() * 1e6 / blocks as f64;
        println!(
            "{obj:?}: {plan}: mean {mean_us:.2} us/block (model {:.2}), worst {:.0} us",
            plan.cost(&model, Objective::MeanLoad) / 1e3,
            worst * 1e6
        );
    }
}
