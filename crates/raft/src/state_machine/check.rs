//! Auth at apply: whether the auth store lets a command's caller make it, as etcd checks when it
//! applies (not when it admits).

use leasehold_lease::LeaseId;

use super::SmState;
use crate::command::Command;
use leasehold_auth::{Access, AuthError, Caller};

/// Whether the auth store lets `caller` (`None`: no token) make a client command, as etcd checks
/// at apply: a put needs write on its key (and on every key of the lease it attaches the key to),
/// read too with `prev_kv`; a delete write on its range; a txn read on every compare and what each
/// op of both branches needs (nested ones too); a lease revoke write on every key of the lease.
/// Anything else (compaction, grants, renewals, the leader's own commands) is not checked.
pub(super) fn check_command(
    state: &SmState,
    caller: Option<&Caller>,
    cmd: &Command,
) -> Result<(), AuthError> {
    if !state.auth.enabled {
        return Ok(());
    }
    let check = Check { state, caller };
    match cmd {
        Command::Put(p) => check.put(p),
        Command::DeleteRange(d) => check.delete(d),
        Command::Txn(t) => check.txn(t),
        Command::LeaseRevoke { id } => check.lease_keys(*id),
        _ => Ok(()),
    }
}

/// One caller's permission checks against the applied state (see [`check_command`]).
pub(super) struct Check<'s> {
    state: &'s SmState,
    caller: Option<&'s Caller>,
}

impl Check<'_> {
    pub(super) fn key(
        &self,
        key: &[u8],
        range_end: &[u8],
        access: Access,
    ) -> Result<(), AuthError> {
        self.state
            .auth
            .check_key(self.caller, key, range_end, access)
    }

    pub(super) fn lease_keys(&self, id: LeaseId) -> Result<(), AuthError> {
        if let Some(lease) = self.state.leases.view(id) {
            for k in lease.keys() {
                self.key(k, b"", Access::Write)?;
            }
        }
        Ok(())
    }

    pub(super) fn put(&self, p: &leasehold_mvcc::PutRequest) -> Result<(), AuthError> {
        self.key(&p.key, b"", Access::Write)?;
        if let Some(lease) = p.lease {
            self.lease_keys(lease)?;
        }
        if p.prev_kv {
            self.key(&p.key, b"", Access::Read)?;
        }
        Ok(())
    }

    pub(super) fn delete(&self, d: &leasehold_mvcc::DeleteRangeRequest) -> Result<(), AuthError> {
        self.key(&d.key, &d.range_end, Access::Write)?;
        if d.prev_kv {
            self.key(&d.key, &d.range_end, Access::Read)?;
        }
        Ok(())
    }

    pub(super) fn txn(&self, t: &leasehold_mvcc::TxnRequest) -> Result<(), AuthError> {
        use leasehold_mvcc::RequestOp;
        for c in &t.compare {
            self.key(&c.key, &c.range_end, Access::Read)?;
        }
        for op in t.success.iter().chain(&t.failure) {
            match op {
                RequestOp::Range(r) => self.key(&r.key, &r.range_end, Access::Read)?,
                RequestOp::Put(p) => self.put(p)?,
                RequestOp::DeleteRange(d) => self.delete(d)?,
                RequestOp::Txn(nested) => self.txn(nested)?,
            }
        }
        Ok(())
    }
}
