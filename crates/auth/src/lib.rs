//! etcd's auth store, as a pure state machine: users (a bcrypt hash, roles), roles (key-range
//! permissions), whether auth is enabled, and the auth revision, which every change bumps so that
//! a request checked against older permissions is refused (`docs/compat.md`, "Auth").
//!
//! Changes arrive as [`AuthChange`]s through the log and apply identically on every member;
//! passwords arrive already hashed (the member that took the request hashed them). Whether a
//! caller may do something is [`AuthState::check_admin`] (root) and [`AuthState::check_key`] (a
//! key or range, read or write). Errors carry etcd's messages ([`AuthError`]).
//!
//! **Architecture Invariant:** no I/O, no clock, no async, no gRPC or Raft types.

mod perm;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use perm::{Access, covers};

/// The name of the user and of the role that may do anything.
pub const ROOT: &str = "root";

/// etcd's permission types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PermKind {
    Read,
    Write,
    ReadWrite,
}

impl PermKind {
    pub fn allows(self, access: Access) -> bool {
        matches!(
            (self, access),
            (PermKind::ReadWrite, _)
                | (PermKind::Read, Access::Read)
                | (PermKind::Write, Access::Write)
        )
    }
}

/// A role's grant over a key (`range_end` empty), a range, or from a key on (`range_end`
/// `"\0"`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Permission {
    pub kind: PermKind,
    pub key: Vec<u8>,
    pub range_end: Vec<u8>,
    /// leasehold's extension: the lease (its id) the grant lives with. It goes when the lease
    /// is revoked or expires, in the same command that deletes the lease's keys.
    pub lease: Option<i64>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    /// The bcrypt hash; `None` for a user added with `no_password` (it cannot authenticate with a
    /// password).
    pub password_hash: Option<String>,
    /// Sorted, without duplicates (as etcd keeps them).
    pub roles: Vec<String>,
}

impl User {
    pub fn is_root(&self) -> bool {
        self.roles.iter().any(|r| r == ROOT)
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Role {
    /// Sorted by key only, in the order etcd keeps them (see [`AuthState::apply`]).
    pub perms: Vec<Permission>,
}

/// A change to the auth store, as the log carries it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AuthChange {
    Enable,
    Disable,
    UserAdd {
        name: String,
        password_hash: Option<String>,
    },
    UserDelete {
        name: String,
    },
    UserChangePassword {
        name: String,
        password_hash: Option<String>,
    },
    UserGrantRole {
        user: String,
        role: String,
    },
    UserRevokeRole {
        user: String,
        role: String,
    },
    RoleAdd {
        name: String,
    },
    RoleDelete {
        name: String,
    },
    RoleGrantPermission {
        role: String,
        perm: Permission,
    },
    RoleRevokePermission {
        role: String,
        key: Vec<u8>,
        range_end: Vec<u8>,
    },
}

impl AuthChange {
    /// The user whose tokens this change ends (a deleted user, a changed password).
    pub fn ends_tokens_of(&self) -> Option<&str> {
        match self {
            AuthChange::UserDelete { name } | AuthChange::UserChangePassword { name, .. } => {
                Some(name)
            }
            _ => None,
        }
    }
}

/// Why an auth request or a check failed: etcd's errors, with etcd's messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum AuthError {
    #[error("etcdserver: root user does not exist")]
    RootUserNotExist,
    #[error("etcdserver: root user does not have root role")]
    RootRoleNotExist,
    #[error("etcdserver: user name already exists")]
    UserAlreadyExist,
    #[error("etcdserver: user name is empty")]
    UserEmpty,
    #[error("etcdserver: user name not found")]
    UserNotFound,
    #[error("etcdserver: role name already exists")]
    RoleAlreadyExist,
    #[error("etcdserver: role name not found")]
    RoleNotFound,
    #[error("etcdserver: role name is empty")]
    RoleEmpty,
    #[error("etcdserver: authentication failed, invalid user ID or password")]
    AuthFailed,
    #[error("etcdserver: permission denied")]
    PermissionDenied,
    #[error("etcdserver: role is not granted to the user")]
    RoleNotGranted,
    #[error("etcdserver: permission is not granted to the role")]
    PermissionNotGranted,
    #[error("etcdserver: authentication is not enabled")]
    AuthNotEnabled,
    #[error("etcdserver: invalid auth token")]
    InvalidAuthToken,
    #[error("etcdserver: invalid auth management")]
    InvalidAuthMgmt,
    #[error("etcdserver: revision of auth store is old")]
    AuthOldRevision,
    /// Not in etcd's map of errors: its clients see it as `Unknown`.
    #[error("auth: authentication failed, password was given for no password user")]
    NoPasswordUser,
    /// A grant bound to a lease that does not exist (leasehold's extension).
    #[error("etcdserver: requested lease not found")]
    LeaseNotFound,
}

/// Who asks, as the edge resolved them from a token: a user, and the auth revision at which the
/// token was looked up.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Caller {
    pub user: String,
    pub revision: u64,
}

/// The whole auth store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthState {
    pub enabled: bool,
    /// Bumped by every change that changes something but enabling (etcd's rule); starts at 1.
    pub revision: u64,
    pub users: BTreeMap<String, User>,
    pub roles: BTreeMap<String, Role>,
}

impl Default for AuthState {
    fn default() -> Self {
        AuthState {
            enabled: false,
            revision: 1,
            users: BTreeMap::new(),
            roles: BTreeMap::new(),
        }
    }
}

impl AuthState {
    /// Applies a change made by `caller` (`None`: no token). Checks, in etcd's order, that the
    /// caller may make it (every change is an admin's, while auth is on), then the change's own
    /// preconditions.
    pub fn apply(&mut self, caller: Option<&Caller>, change: &AuthChange) -> Result<(), AuthError> {
        self.check_admin(caller)?;
        let bump = match change {
            AuthChange::Enable => {
                if !self.enabled {
                    let root = self.users.get(ROOT).ok_or(AuthError::RootUserNotExist)?;
                    if !root.is_root() {
                        return Err(AuthError::RootRoleNotExist);
                    }
                    self.enabled = true;
                }
                false
            }
            AuthChange::Disable => std::mem::replace(&mut self.enabled, false),
            AuthChange::UserAdd {
                name,
                password_hash,
            } => {
                if name.is_empty() {
                    return Err(AuthError::UserEmpty);
                }
                if self.users.contains_key(name) {
                    return Err(AuthError::UserAlreadyExist);
                }
                let user = User {
                    password_hash: password_hash.clone(),
                    roles: Vec::new(),
                };
                self.users.insert(name.clone(), user);
                true
            }
            AuthChange::UserDelete { name } => {
                if self.enabled && name == ROOT {
                    return Err(AuthError::InvalidAuthMgmt);
                }
                self.users.remove(name).ok_or(AuthError::UserNotFound)?;
                true
            }
            AuthChange::UserChangePassword {
                name,
                password_hash,
            } => {
                let user = self.users.get_mut(name).ok_or(AuthError::UserNotFound)?;
                user.password_hash = password_hash.clone();
                true
            }
            AuthChange::UserGrantRole { user, role } => {
                if !self.users.contains_key(user) {
                    return Err(AuthError::UserNotFound);
                }
                // etcd never looks `root` up: it may be granted before the role exists.
                if role != ROOT && !self.roles.contains_key(role) {
                    return Err(AuthError::RoleNotFound);
                }
                let roles = &mut self.users.get_mut(user).expect("checked").roles;
                match roles.binary_search(role) {
                    Ok(_) => false,
                    Err(at) => {
                        roles.insert(at, role.clone());
                        true
                    }
                }
            }
            AuthChange::UserRevokeRole { user, role } => {
                if self.enabled && user == ROOT && role == ROOT {
                    return Err(AuthError::InvalidAuthMgmt);
                }
                let u = self.users.get_mut(user).ok_or(AuthError::UserNotFound)?;
                let at = u
                    .roles
                    .iter()
                    .position(|r| r == role)
                    .ok_or(AuthError::RoleNotGranted)?;
                u.roles.remove(at);
                true
            }
            AuthChange::RoleAdd { name } => {
                if name.is_empty() {
                    return Err(AuthError::RoleEmpty);
                }
                if self.roles.contains_key(name) {
                    return Err(AuthError::RoleAlreadyExist);
                }
                self.roles.insert(name.clone(), Role::default());
                true
            }
            AuthChange::RoleDelete { name } => {
                if self.enabled && name == ROOT {
                    return Err(AuthError::InvalidAuthMgmt);
                }
                self.roles.remove(name).ok_or(AuthError::RoleNotFound)?;
                for user in self.users.values_mut() {
                    user.roles.retain(|r| r != name);
                }
                true
            }
            AuthChange::RoleGrantPermission { role, perm } => {
                let r = self.roles.get_mut(role).ok_or(AuthError::RoleNotFound)?;
                // etcd looks at the first grant whose key is not below the new one: the same key
                // and end is updated in place; anything else is added, kept sorted by key.
                let at = r.perms.partition_point(|p| p.key < perm.key);
                match r.perms.get_mut(at) {
                    Some(p) if p.key == perm.key && p.range_end == perm.range_end => {
                        p.kind = perm.kind;
                        p.lease = perm.lease;
                    }
                    _ => {
                        r.perms.push(perm.clone());
                        r.perms.sort_by(|a, b| a.key.cmp(&b.key));
                    }
                }
                true
            }
            AuthChange::RoleRevokePermission {
                role,
                key,
                range_end,
            } => {
                let r = self.roles.get_mut(role).ok_or(AuthError::RoleNotFound)?;
                let before = r.perms.len();
                r.perms
                    .retain(|p| !(p.key == *key && p.range_end == *range_end));
                if r.perms.len() == before {
                    return Err(AuthError::PermissionNotGranted);
                }
                true
            }
        };
        if bump {
            self.revision += 1;
        }
        Ok(())
    }

    /// Whether `caller` may administer (etcd's `IsAdminPermitted`): anyone while auth is off;
    /// otherwise an existing user with the root role. The auth revision is not compared.
    pub fn check_admin(&self, caller: Option<&Caller>) -> Result<(), AuthError> {
        if !self.enabled {
            return Ok(());
        }
        let caller = caller
            .filter(|c| !c.user.is_empty())
            .ok_or(AuthError::UserEmpty)?;
        let user = self
            .users
            .get(&caller.user)
            .ok_or(AuthError::UserNotFound)?;
        if user.is_root() {
            Ok(())
        } else {
            Err(AuthError::PermissionDenied)
        }
    }

    /// Whether `caller` may `access` the key (`range_end` empty) or the range `[key,
    /// range_end)` (`"\0"`: from `key` on). etcd's order: anyone while auth is off; no caller is
    /// refused; a caller whose permissions were read at an older revision is refused; then root
    /// may do anything, and anyone else needs grants (over all their roles) that cover it.
    pub fn check_key(
        &self,
        caller: Option<&Caller>,
        key: &[u8],
        range_end: &[u8],
        access: Access,
    ) -> Result<(), AuthError> {
        if !self.enabled {
            return Ok(());
        }
        let caller = caller
            .filter(|c| !c.user.is_empty())
            .ok_or(AuthError::UserEmpty)?;
        if caller.revision < self.revision {
            return Err(AuthError::AuthOldRevision);
        }
        let user = self
            .users
            .get(&caller.user)
            .ok_or(AuthError::PermissionDenied)?;
        if user.is_root() {
            return Ok(());
        }
        let granted = user
            .roles
            .iter()
            .filter_map(|r| self.roles.get(r))
            .flat_map(|r| &r.perms)
            .filter(|p| p.kind.allows(access));
        if covers(granted, key, range_end) {
            Ok(())
        } else {
            Err(AuthError::PermissionDenied)
        }
    }

    /// The lease `lease` ended: every grant bound to it goes (and the auth revision moves, so
    /// that no write checked before counts on them). Whether any went.
    pub fn end_lease(&mut self, lease: i64) -> bool {
        let mut ended = false;
        for role in self.roles.values_mut() {
            let before = role.perms.len();
            role.perms.retain(|p| p.lease != Some(lease));
            ended |= role.perms.len() != before;
        }
        if ended {
            self.revision += 1;
        }
        ended
    }

    /// The caller of a request that carries `token`'s user, as of now.
    pub fn caller(&self, user: &str) -> Caller {
        Caller {
            user: user.to_owned(),
            revision: self.revision,
        }
    }
}

#[cfg(test)]
mod tests;
