//! Auth: users, roles and their key-range permissions, enabling and disabling auth, and
//! Authenticate (simple tokens), as etcd 3.5 serves them. Changes go through the log
//! (`leasehold_auth::AuthChange`, checked when applied); passwords are hashed with bcrypt here, on
//! the member that took the request, so the log carries hashes only. Lists and gets read this
//! member's applied auth store after a linearizable read, and check the caller as etcd does.
//!
//! Every other service asks [`ServerContext::caller`] who a request's token names and hands that
//! caller to `Replica::propose_as`, or checks reads itself ([`ServerContext::check_read`]).

use std::sync::Arc;

use leasehold_api::authpb;
use leasehold_api::etcdserverpb::{self as pb, auth_server::Auth};
use leasehold_auth::{AuthChange, AuthError, Caller, PermKind, Permission};
use leasehold_raft::{AuthWrite, Authenticate};
use tonic::{Request, Response, Status};

use crate::context::ServerContext;
use crate::error::ApiError;
use crate::jwt::TokenMode;

/// The gRPC metadata that carries a token (etcd's `token`; its gateway passes `authorization`).
const TOKEN_KEYS: [&str; 2] = ["token", "authorization"];

/// The token a request carries, if any.
pub fn token<T>(req: &Request<T>) -> Option<String> {
    let token = TOKEN_KEYS
        .iter()
        .find_map(|k| req.metadata().get(*k))
        .map(|v| v.to_str().unwrap_or_default());
    token.map(|t| t.strip_prefix("Bearer ").unwrap_or(t).to_owned())
}

/// The common name of the client certificate the connection's TLS handshake verified, if any.
pub fn common_name<T>(req: &Request<T>) -> Option<String> {
    req.extensions()
        .get::<crate::ConnInfo>()
        .and_then(|c| c.common_name.clone())
}

impl ServerContext {
    /// Who the request's token names (`None`: auth is off, or no token). An unknown or expired
    /// token is refused with etcd's `invalid auth token`.
    pub fn caller<T>(&self, req: &Request<T>) -> Result<Option<Caller>, ApiError> {
        self.caller_of(token(req).as_deref(), common_name(req).as_deref())
    }

    /// Who a request names (see [`ServerContext::caller`]): a JWT carries its user and the auth
    /// revision it was issued at; a simple token is looked up, at the current revision; without a
    /// token, the verified client certificate's common name is the user, as in etcd.
    pub fn caller_of(
        &self,
        token: Option<&str>,
        common_name: Option<&str>,
    ) -> Result<Option<Caller>, ApiError> {
        if !self.replica.auth_enabled() {
            return Ok(None);
        }
        match (&self.tokens, token, common_name) {
            (TokenMode::Jwt(jwt), Some(token), _) => jwt
                .verify(token)
                .map(Some)
                .ok_or(ApiError::Auth(AuthError::InvalidAuthToken)),
            (_, None, Some(cn)) if !cn.is_empty() => {
                Ok(Some(self.replica.read_auth(|a| a.caller(cn))))
            }
            _ => Ok(self.replica.auth_caller(token)?),
        }
    }

    /// Whether `caller` may read the key (`range_end` empty) or range.
    pub fn check_read(
        &self,
        caller: Option<&Caller>,
        key: &[u8],
        range_end: &[u8],
    ) -> Result<(), ApiError> {
        if !self.replica.auth_enabled() {
            return Ok(());
        }
        Ok(self
            .replica
            .read_auth(|a| a.check_key(caller, key, range_end, leasehold_auth::Access::Read))?)
    }

    /// Whether `caller` may administer (a user with the root role, or anyone while auth is off).
    pub fn check_admin(&self, caller: Option<&Caller>) -> Result<(), ApiError> {
        Ok(self.replica.read_auth(|a| a.check_admin(caller))?)
    }

    /// The request's caller, who must be signed in while auth is on: etcd 3.6+'s rule for calls
    /// any user may make (Status, MemberList, listing alarms, LeaseGrant, LeaseRevoke,
    /// LeaseTimeToLive, LeaseLeases). No token: `user name is empty`.
    pub fn signed_in<T>(&self, req: &Request<T>) -> Result<Option<Caller>, ApiError> {
        let caller = self.caller(req)?;
        if caller.is_none() && self.replica.auth_enabled() {
            return Err(ApiError::Auth(AuthError::UserEmpty));
        }
        Ok(caller)
    }

    /// The request's caller, who must administer (see [`ServerContext::check_admin`]).
    pub fn admin<T>(&self, req: &Request<T>) -> Result<Option<Caller>, ApiError> {
        let caller = self.caller(req)?;
        self.check_admin(caller.as_ref())?;
        Ok(caller)
    }
}

pub struct AuthService {
    ctx: Arc<ServerContext>,
}

impl AuthService {
    pub fn new(ctx: Arc<ServerContext>) -> AuthService {
        AuthService { ctx }
    }

    /// Proposes a change on behalf of the request's caller; the header after it.
    async fn change<T>(
        &self,
        req: &Request<T>,
        change: AuthChange,
    ) -> Result<Option<pb::ResponseHeader>, Status> {
        let caller = self.ctx.caller(req)?;
        self.ctx
            .replica
            .propose(AuthWrite { caller, change })
            .await
            .map_err(ApiError::from)?
            .map_err(ApiError::from)?;
        self.header(false).await
    }

    /// The response header; after a linearizable read if `linearizable` (reads of the auth
    /// store then see every change committed before them).
    async fn header(&self, linearizable: bool) -> Result<Option<pb::ResponseHeader>, Status> {
        let revision = self
            .ctx
            .replica
            .read(linearizable, |s| s.current_revision())
            .await
            .map_err(ApiError::from)?;
        Ok(self.ctx.header().at(revision))
    }

    /// bcrypt of `password` at `--bcrypt-cost`, off the runtime (it is slow on purpose).
    async fn hash(&self, password: String) -> Result<String, Status> {
        let cost = self.ctx.bcrypt_cost;
        tokio::task::spawn_blocking(move || bcrypt::hash(password, cost))
            .await
            .map_err(|e| Status::internal(format!("hashing the password: {e}")))?
            .map_err(|e| Status::unknown(e.to_string()))
    }
}

fn perm_kind(t: i32) -> PermKind {
    match authpb::permission::Type::try_from(t) {
        Ok(authpb::permission::Type::Write) => PermKind::Write,
        Ok(authpb::permission::Type::Readwrite) => PermKind::ReadWrite,
        Ok(authpb::permission::Type::Read) | Err(_) => PermKind::Read,
    }
}

fn perm_type(k: PermKind) -> i32 {
    match k {
        PermKind::Read => authpb::permission::Type::Read as i32,
        PermKind::Write => authpb::permission::Type::Write as i32,
        PermKind::ReadWrite => authpb::permission::Type::Readwrite as i32,
    }
}

/// 16 random letters, the first part of a simple token (etcd's form).
fn token_prefix() -> String {
    const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("the OS random source");
    bytes
        .iter()
        .map(|b| LETTERS[usize::from(*b) % LETTERS.len()] as char)
        .collect()
}

#[tonic::async_trait]
impl Auth for AuthService {
    async fn auth_enable(
        &self,
        req: Request<pb::AuthEnableRequest>,
    ) -> Result<Response<pb::AuthEnableResponse>, Status> {
        let header = self.change(&req, AuthChange::Enable).await?;
        Ok(Response::new(pb::AuthEnableResponse { header }))
    }

    async fn auth_disable(
        &self,
        req: Request<pb::AuthDisableRequest>,
    ) -> Result<Response<pb::AuthDisableResponse>, Status> {
        let header = self.change(&req, AuthChange::Disable).await?;
        Ok(Response::new(pb::AuthDisableResponse { header }))
    }

    async fn auth_status(
        &self,
        req: Request<pb::AuthStatusRequest>,
    ) -> Result<Response<pb::AuthStatusResponse>, Status> {
        // Anyone may ask (etcd 3.6+); a token given must still be valid.
        self.ctx.caller(&req)?;
        let header = self.header(true).await?;
        let (enabled, auth_revision) = self.ctx.replica.read_auth(|a| (a.enabled, a.revision));
        Ok(Response::new(pb::AuthStatusResponse {
            header,
            enabled,
            auth_revision,
        }))
    }

    async fn authenticate(
        &self,
        req: Request<pb::AuthenticateRequest>,
    ) -> Result<Response<pb::AuthenticateResponse>, Status> {
        let pb::AuthenticateRequest { name, password } = req.into_inner();
        // A password checked against an auth store that changed before the token was applied
        // is checked again (etcd loops the same way); a few rounds at most.
        for _ in 0..3 {
            self.header(true).await?;
            let (enabled, hash, revision) = self.ctx.replica.read_auth(|a| {
                (
                    a.enabled,
                    a.users.get(&name).map(|u| u.password_hash.clone()),
                    a.revision,
                )
            });
            if !enabled {
                return Err(ApiError::from(AuthError::AuthNotEnabled).into());
            }
            let hash = match hash {
                None => return Err(ApiError::from(AuthError::AuthFailed).into()),
                Some(None) => return Err(ApiError::from(AuthError::NoPasswordUser).into()),
                Some(Some(hash)) => hash,
            };
            let given = password.clone();
            let matches = tokio::task::spawn_blocking(move || bcrypt::verify(given, &hash))
                .await
                .map_err(|e| Status::internal(format!("checking the password: {e}")))?
                .unwrap_or(false);
            if !matches {
                return Err(ApiError::from(AuthError::AuthFailed).into());
            }
            if let TokenMode::Jwt(jwt) = &self.ctx.tokens {
                // Nothing to register: any member verifies the signature.
                let token = jwt
                    .sign(&name, revision)
                    .ok_or_else(|| Status::unknown("auth: this member has no JWT private key"))?;
                let header = self.header(false).await?;
                return Ok(Response::new(pb::AuthenticateResponse { header, token }));
            }
            let token = self
                .ctx
                .replica
                .propose(Authenticate {
                    user: name.clone(),
                    prefix: token_prefix(),
                    revision,
                })
                .await
                .map_err(ApiError::from)?;
            match token {
                Ok(token) => {
                    let header = self.header(false).await?;
                    return Ok(Response::new(pb::AuthenticateResponse { header, token }));
                }
                Err(AuthError::AuthFailed) => continue,
                Err(e) => return Err(ApiError::from(e).into()),
            }
        }
        Err(ApiError::from(AuthError::AuthFailed).into())
    }

    async fn user_add(
        &self,
        req: Request<pb::AuthUserAddRequest>,
    ) -> Result<Response<pb::AuthUserAddResponse>, Status> {
        let no_password = req
            .get_ref()
            .options
            .as_ref()
            .is_some_and(|o| o.no_password);
        let name = req.get_ref().name.clone();
        let password_hash = if no_password || name.is_empty() {
            None
        } else {
            Some(self.hash(req.get_ref().password.clone()).await?)
        };
        let change = AuthChange::UserAdd {
            name,
            password_hash,
        };
        let header = self.change(&req, change).await?;
        Ok(Response::new(pb::AuthUserAddResponse { header }))
    }

    async fn user_get(
        &self,
        req: Request<pb::AuthUserGetRequest>,
    ) -> Result<Response<pb::AuthUserGetResponse>, Status> {
        let header = self.header(true).await?;
        let caller = self.ctx.caller(&req)?;
        let name = &req.get_ref().name;
        // Anyone may read themselves; anyone else needs to be an admin.
        if caller.as_ref().is_none_or(|c| c.user != *name) {
            self.ctx.check_admin(caller.as_ref())?;
        }
        let roles = self
            .ctx
            .replica
            .read_auth(|a| a.users.get(name).map(|u| u.roles.clone()))
            .ok_or(ApiError::from(AuthError::UserNotFound))?;
        Ok(Response::new(pb::AuthUserGetResponse { header, roles }))
    }

    async fn user_list(
        &self,
        req: Request<pb::AuthUserListRequest>,
    ) -> Result<Response<pb::AuthUserListResponse>, Status> {
        let header = self.header(true).await?;
        let caller = self.ctx.caller(&req)?;
        self.ctx.check_admin(caller.as_ref())?;
        let users = self
            .ctx
            .replica
            .read_auth(|a| a.users.keys().cloned().collect());
        Ok(Response::new(pb::AuthUserListResponse { header, users }))
    }

    async fn user_delete(
        &self,
        req: Request<pb::AuthUserDeleteRequest>,
    ) -> Result<Response<pb::AuthUserDeleteResponse>, Status> {
        let name = req.get_ref().name.clone();
        let header = self.change(&req, AuthChange::UserDelete { name }).await?;
        Ok(Response::new(pb::AuthUserDeleteResponse { header }))
    }

    async fn user_change_password(
        &self,
        req: Request<pb::AuthUserChangePasswordRequest>,
    ) -> Result<Response<pb::AuthUserChangePasswordResponse>, Status> {
        let password_hash = Some(self.hash(req.get_ref().password.clone()).await?);
        let change = AuthChange::UserChangePassword {
            name: req.get_ref().name.clone(),
            password_hash,
        };
        let header = self.change(&req, change).await?;
        Ok(Response::new(pb::AuthUserChangePasswordResponse { header }))
    }

    async fn user_grant_role(
        &self,
        req: Request<pb::AuthUserGrantRoleRequest>,
    ) -> Result<Response<pb::AuthUserGrantRoleResponse>, Status> {
        let change = AuthChange::UserGrantRole {
            user: req.get_ref().user.clone(),
            role: req.get_ref().role.clone(),
        };
        let header = self.change(&req, change).await?;
        Ok(Response::new(pb::AuthUserGrantRoleResponse { header }))
    }

    async fn user_revoke_role(
        &self,
        req: Request<pb::AuthUserRevokeRoleRequest>,
    ) -> Result<Response<pb::AuthUserRevokeRoleResponse>, Status> {
        let change = AuthChange::UserRevokeRole {
            user: req.get_ref().name.clone(),
            role: req.get_ref().role.clone(),
        };
        let header = self.change(&req, change).await?;
        Ok(Response::new(pb::AuthUserRevokeRoleResponse { header }))
    }

    async fn role_add(
        &self,
        req: Request<pb::AuthRoleAddRequest>,
    ) -> Result<Response<pb::AuthRoleAddResponse>, Status> {
        let name = req.get_ref().name.clone();
        let header = self.change(&req, AuthChange::RoleAdd { name }).await?;
        Ok(Response::new(pb::AuthRoleAddResponse { header }))
    }

    async fn role_get(
        &self,
        req: Request<pb::AuthRoleGetRequest>,
    ) -> Result<Response<pb::AuthRoleGetResponse>, Status> {
        let header = self.header(true).await?;
        let caller = self.ctx.caller(&req)?;
        let role = &req.get_ref().role;
        // Anyone may read a role they hold; anyone else needs to be an admin.
        let holds = caller.as_ref().is_some_and(|c| {
            self.ctx.replica.read_auth(|a| {
                a.users
                    .get(&c.user)
                    .is_some_and(|u| u.roles.iter().any(|r| r == role))
            })
        });
        if !holds {
            self.ctx.check_admin(caller.as_ref())?;
        }
        let perm = self
            .ctx
            .replica
            .read_auth(|a| a.roles.get(role).map(|r| r.perms.clone()))
            .ok_or(ApiError::from(AuthError::RoleNotFound))?
            .into_iter()
            .map(|p| authpb::Permission {
                perm_type: perm_type(p.kind),
                key: p.key,
                range_end: p.range_end,
                lease: p.lease.unwrap_or(0),
            })
            .collect();
        Ok(Response::new(pb::AuthRoleGetResponse { header, perm }))
    }

    async fn role_list(
        &self,
        req: Request<pb::AuthRoleListRequest>,
    ) -> Result<Response<pb::AuthRoleListResponse>, Status> {
        let header = self.header(true).await?;
        let caller = self.ctx.caller(&req)?;
        self.ctx.check_admin(caller.as_ref())?;
        let roles = self
            .ctx
            .replica
            .read_auth(|a| a.roles.keys().cloned().collect());
        Ok(Response::new(pb::AuthRoleListResponse { header, roles }))
    }

    async fn role_delete(
        &self,
        req: Request<pb::AuthRoleDeleteRequest>,
    ) -> Result<Response<pb::AuthRoleDeleteResponse>, Status> {
        let name = req.get_ref().role.clone();
        let header = self.change(&req, AuthChange::RoleDelete { name }).await?;
        Ok(Response::new(pb::AuthRoleDeleteResponse { header }))
    }

    async fn role_grant_permission(
        &self,
        req: Request<pb::AuthRoleGrantPermissionRequest>,
    ) -> Result<Response<pb::AuthRoleGrantPermissionResponse>, Status> {
        let Some(perm) = req.get_ref().perm.clone() else {
            return Err(Status::invalid_argument("etcdserver: permission not given"));
        };
        let change = AuthChange::RoleGrantPermission {
            role: req.get_ref().name.clone(),
            perm: Permission {
                kind: perm_kind(perm.perm_type),
                key: perm.key,
                range_end: perm.range_end,
                lease: match (req.get_ref().lease, perm.lease) {
                    (0, 0) => None,
                    (0, lease) | (lease, _) => Some(lease),
                },
            },
        };
        let header = self.change(&req, change).await?;
        Ok(Response::new(pb::AuthRoleGrantPermissionResponse {
            header,
        }))
    }

    async fn role_revoke_permission(
        &self,
        req: Request<pb::AuthRoleRevokePermissionRequest>,
    ) -> Result<Response<pb::AuthRoleRevokePermissionResponse>, Status> {
        let r = req.get_ref();
        let change = AuthChange::RoleRevokePermission {
            role: r.role.clone(),
            key: r.key.clone(),
            range_end: r.range_end.clone(),
        };
        let header = self.change(&req, change).await?;
        Ok(Response::new(pb::AuthRoleRevokePermissionResponse {
            header,
        }))
    }
}
