//! The network between members: each message delayed by a draw from the seed's latency, dropped
//! or sent twice while the faults last, and nothing over a cut link.

use super::{Ev, World};

impl World {
    pub(super) fn latency(&mut self) -> u64 {
        let (lo, hi) = self.faults.latency_us;
        // Mostly short, sometimes long: the square of a uniform draw.
        let f = self.rng.fraction();
        lo + ((hi - lo) as f64 * f * f) as u64
    }

    /// A message over the network between members: cut links drop it; otherwise it may be
    /// dropped, duplicated (if `may_repeat`: Raft's messages, which raft-rs must take twice), and
    /// is delayed (which reorders).
    pub(super) fn send<T: Clone>(
        &mut self,
        from: usize,
        to: usize,
        extra: u64,
        may_repeat: bool,
        ev: impl Fn(T) -> Ev,
        payload: T,
    ) {
        if from == to || self.cut.contains(&(from, to)) {
            return;
        }
        if !self.healed() && self.rng.chance(self.faults.drop) {
            return;
        }
        let copies = if may_repeat && !self.healed() && self.rng.chance(self.faults.dup) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let delay = extra + self.latency();
            self.after(delay, ev(payload.clone()));
        }
    }
}
