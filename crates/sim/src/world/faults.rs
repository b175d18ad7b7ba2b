//! Faults drawn from the seed: partitions, crashes (torn writes and flipped bits among them),
//! pauses, leadership transfers and, once healed, the kill churn of leaders.

use std::path::Path;

use leasehold_wal::Crash;

use super::{Ev, Kind, MS, SEC, World};
use crate::WAL_DIR;
use crate::rng::Rng;

/// The fault mix of one seed (swarm testing: each seed draws its own).
#[derive(Clone, Debug)]
pub(super) struct Faults {
    pub(super) members: usize,
    pub(super) latency_us: (u64, u64),
    pub(super) drop: f64,
    pub(super) dup: f64,
    pub(super) fsync_us: (u64, u64),
    /// Mean seconds between faults of each kind; `None`: never.
    pub(super) partition_every: Option<u64>,
    pub(super) crash_every: Option<u64>,
    pub(super) pause_every: Option<u64>,
    pub(super) transfer_every: Option<u64>,
    pub(super) membership_every: Option<u64>,
    pub(super) torn_crashes: bool,
    pub(super) bit_flips: bool,
    pub(super) drift_ppm_max: i64,
}

impl Faults {
    pub(super) fn draw(rng: &mut Rng) -> Faults {
        let sometimes =
            |rng: &mut Rng, p: f64, lo: u64, hi: u64| rng.chance(p).then(|| rng.range(lo, hi));
        let members = if rng.chance(0.25) { 5 } else { 3 };
        // Sometimes a fast network and disk, where a commit takes well under a millisecond.
        let fast = rng.chance(0.3);
        let lat_max = if fast {
            rng.range(150, 400)
        } else {
            rng.range(1, 40) * MS
        };
        Faults {
            members,
            latency_us: (100, lat_max),
            drop: if rng.chance(0.6) {
                rng.fraction() * 0.1
            } else {
                0.0
            },
            dup: if rng.chance(0.4) {
                rng.fraction() * 0.05
            } else {
                0.0
            },
            fsync_us: if fast {
                (20, rng.range(30, 200))
            } else {
                (50, rng.range(100, 10 * MS))
            },
            partition_every: sometimes(rng, 0.6, 2, 10),
            crash_every: sometimes(rng, 0.6, 2, 10),
            pause_every: sometimes(rng, 0.4, 3, 12),
            transfer_every: sometimes(rng, 0.4, 2, 8),
            membership_every: sometimes(rng, 0.3, 3, 10),
            torn_crashes: rng.chance(0.5),
            bit_flips: rng.chance(0.2),
            drift_ppm_max: if rng.chance(0.4) {
                0
            } else {
                rng.range(1, 100) as i64
            },
        }
    }
}

/// Kill churn once healed: `every` is the period at which the leader is killed and restarted, in
/// the seeds that have it (`None` in the others, which move the leader every 3 s instead).
pub(super) struct KillChurn {
    /// Its own draws, so that seeds without it draw exactly as before.
    pub(super) rng: Rng,
    pub(super) every: Option<u64>,
}

impl World {
    pub(super) fn partition(&mut self) {
        if self.healed() {
            return;
        }
        let n = self.members.len();
        let one = self.rng.below(n as u64) as usize;
        let leader = self.members.iter().find_map(|mm| {
            mm.status()
                .filter(|s| s.is_leader)
                .map(|s| (s.id - 1) as usize)
        });
        match self.rng.below(3) {
            0 => {
                for other in 0..n {
                    if other != one {
                        self.cut.insert((one, other));
                        self.cut.insert((other, one));
                    }
                }
                self.note(format!("partition: m{} isolated", one + 1));
            }
            1 => {
                for other in 0..n {
                    if other != one {
                        self.cut.insert((one, other));
                    }
                }
                self.note(format!("partition: m{} can receive but not send", one + 1));
            }
            _ => {
                if let Some(l) = leader.filter(|l| *l != one)
                    && self.raft_cut_rng.chance(0.5)
                {
                    // What etcd's TestHTTPHealthHandler makes with a proxy in front of one
                    // member's peer port: the leader cannot reach it, while its own connections
                    // to the leader (its asks, and their answers) still go.
                    self.raft_cut.insert((l, one));
                    self.note(format!(
                        "partition: m{} hears no Raft traffic from the leader m{}; its asks still go",
                        one + 1,
                        l + 1
                    ));
                } else if let Some(l) = leader.filter(|l| *l != one) {
                    self.cut.insert((l, one));
                    self.cut.insert((one, l));
                    self.note(format!(
                        "partition: m{} cut off from the leader m{} only",
                        one + 1,
                        l + 1
                    ));
                }
            }
        }
        let lasts = self.rng.range(SEC / 2, 4 * SEC);
        self.after(lasts, Ev::HealNetwork);
        let every = self.faults.partition_every.expect("scheduled");
        let next = self.rng.range(lasts + SEC / 2, lasts + every * SEC);
        self.after(next, Ev::Partition);
    }

    pub(super) fn crash(&mut self) {
        if self.healed() {
            return;
        }
        let m = self.rng.below(self.members.len() as u64) as usize;
        if self.members[m].is_up() {
            self.members[m].crash();
            let crash = if self.faults.torn_crashes {
                Crash::TearSectors(self.rng.next_u64())
            } else {
                Crash::LoseUnsynced
            };
            self.members[m].disk.mem().crash(crash);
            self.note(format!("m{} crashed ({crash:?})", m + 1));
            let down = self.rng.range(SEC / 5, 3 * SEC);
            self.after(down, Ev::Restart(m));
        }
        let every = self.faults.crash_every.expect("scheduled");
        let next = self.rng.range(SEC / 2, every * SEC);
        self.after(next, Ev::Crash);
    }

    pub(super) fn flip_bit(&mut self, m: usize) {
        let fs = self.members[m].disk.mem().clone();
        let dir = Path::new(WAL_DIR);
        let Ok(names) = leasehold_wal::Fs::list(&fs, dir) else {
            return;
        };
        if names.is_empty() {
            return;
        }
        let name = &names[self.rng.below(names.len() as u64) as usize];
        let path = dir.join(name);
        let Some(contents) = fs.contents(&path) else {
            return;
        };
        // Somewhere in what was written (the zero-filled tail is not data).
        let used = contents.iter().rposition(|b| *b != 0).unwrap_or(0);
        if used == 0 {
            return;
        }
        let byte = self.rng.below(used as u64 + 1) as usize;
        let bit = self.rng.below(8) as u8;
        fs.flip_bit(&path, byte, bit);
        self.note(format!(
            "m{}: bit {bit} of byte {byte} of {name} flipped",
            m + 1
        ));
    }

    pub(super) fn pause(&mut self) {
        if self.healed() {
            return;
        }
        let m = self.rng.below(self.members.len() as u64) as usize;
        let lasts = self.rng.range(SEC / 5, 3 * SEC);
        self.members[m].paused_until = self.now + lasts;
        self.note(format!("m{} paused for {} ms", m + 1, lasts / MS));
        let every = self.faults.pause_every.expect("scheduled");
        let next = self.rng.range(lasts, lasts + every * SEC);
        self.after(next, Ev::Pause);
    }

    /// In half the seeds whose members are all up and whose membership is settled at heal, the
    /// leader is then killed and restarted every `3 × the longest election timeout + 0.2 to 2 s`
    /// (3: `Options::kill_churn_timeouts`):
    /// the longest election a kill can cause (two timeouts: the first candidate may be refused
    /// by a member that still heard the old leader, or have too short a log), plus what the new
    /// leader leaves each lease (the election timeout), plus time to commit. A dead holder's
    /// lease then still ends within the checked bound (`final_checks`). Churn faster than that can
    /// give a lease that is due the promotion's grace again and again, each leader gone before
    /// the grace runs out (docs/lease.md).
    pub(super) fn choose_kill_churn(&mut self) {
        let chosen = self.kills.rng.chance(0.5);
        let extra = self.kills.rng.range(SEC / 5, 2 * SEC);
        let settled = self.removing.is_none()
            && self.adding.is_none()
            && self
                .members
                .iter()
                .all(|m| m.removed || (m.is_up() && m.refused.is_none()));
        if chosen && settled {
            let et = self.longest_election_timeout();
            let every = self.options.kill_churn_timeouts * et + extra;
            self.kills.every = Some(every);
            self.note(format!(
                "kill churn: the leader is killed every {} ms",
                every / MS
            ));
        }
    }

    /// Kill churn: kill -9 the leader (losing what it had not synced) and start it again a little
    /// later, as `cluster.rs` did with real processes.
    pub(super) fn kill_leader(&mut self) {
        let Some(every) = self.kills.every else {
            return;
        };
        if self.now > self.end.saturating_sub(8 * SEC) {
            return;
        }
        if let Some(l) = self.leader() {
            self.members[l].crash();
            self.reign_ends(l);
            let crash = if self.faults.torn_crashes {
                Crash::TearSectors(self.kills.rng.next_u64())
            } else {
                Crash::LoseUnsynced
            };
            self.members[l].disk.mem().crash(crash);
            self.note(format!("leader m{} killed ({crash:?})", l + 1));
            let down = self.kills.rng.range(SEC / 5, SEC);
            self.after(down, Ev::Restart(l));
        }
        self.after(every, Ev::KillLeader);
    }

    /// Member `m` stopped timing leases (demoted or killed).
    pub(super) fn reign_ends(&mut self, m: usize) {
        if let Some(r) = self.reigning.remove(&m) {
            self.reigns[r].until = Some(self.now);
        }
    }

    /// MoveLeader to another member: in chaos at the drawn rate, and every 3 s once healed (a
    /// leader change for each lease to live through).
    pub(super) fn transfer(&mut self) {
        let end_of_transfers = self.end.saturating_sub(8 * SEC);
        if self.now > end_of_transfers || (self.healed() && self.kills.every.is_some()) {
            return;
        }
        if let Some(l) = self.leader() {
            let n = self.members.len() as u64;
            let to = (l + 1 + self.rng.below(n - 1) as usize) % n as usize;
            if self.members[to].is_up() {
                self.note(format!("move leader m{} -> m{}", l + 1, to + 1));
                let mut out = Vec::new();
                self.members[l].transfer(self.now, to as u64 + 1, &mut out);
                self.deliver(l, out);
            }
        }
        let next = match (self.healed(), self.faults.transfer_every) {
            (true, _) => 3 * SEC,
            (false, Some(every)) => self.rng.range(SEC, every * SEC),
            (false, None) => return,
        };
        self.after(next, Ev::Transfer);
    }

    /// The faults stop: the network heals, stopped members continue, crashed ones restart;
    /// every lease client dies a second later, and leaders change every 3 s.
    pub(super) fn heal(&mut self) {
        self.healed_at = Some(self.now);
        self.cut.clear();
        self.raft_cut.clear();
        self.note("heal: faults stop".into());
        for m in 0..self.members.len() {
            self.members[m].paused_until = self.members[m].paused_until.min(self.now);
            if !self.members[m].is_up()
                && self.members[m].refused.is_none()
                && !self.members[m].removed
            {
                self.start_member(m);
            }
        }
        // Half the lease clients keep their leases through what follows (drawn apart from the
        // main stream); the others die a second from now.
        for c in 0..self.clients.len() {
            if self.clients[c].kind == Kind::Lease
                && !self.clients[c].dead
                && self.keep_rng.chance(0.5)
            {
                self.clients[c].keeper = true;
                if let Some(held) = self.clients[c].held {
                    self.leases.kept(held.id.get());
                }
            }
        }
        self.choose_kill_churn();
        if self.kills.every.is_some() {
            self.after(3 * SEC, Ev::KillLeader);
        } else if self.faults.transfer_every.is_none() {
            self.after(3 * SEC, Ev::Transfer);
        }
        // And a watch from a past revision, as a client that reconnects asks for one.
        let current = self
            .members
            .iter()
            .map(|m| m.machine.store().current_revision())
            .max()
            .unwrap_or(1);
        let start = self.rng.range(1, current.max(1) as u64 + 1) as i64;
        self.new_watcher(start);
    }

    // ---- clients ----
}
