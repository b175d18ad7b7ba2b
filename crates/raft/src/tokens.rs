//! The simple tokens this member knows (etcd's `--auth-token simple`): registered by the
//! Authenticate entries it applies, on every member alike, and never persisted, so a restart ends
//! them, as etcd's. A token lives while it is used: each lookup pushes its expiry to now + TTL
//! (`--auth-token-ttl`); a user's tokens end when the user is deleted or its password changed, and
//! all of them when auth is disabled.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug)]
pub(crate) struct SimpleTokens {
    /// Token → (user, expiry).
    tokens: Mutex<HashMap<String, (String, Instant)>>,
    ttl: Duration,
}

impl Default for SimpleTokens {
    fn default() -> Self {
        SimpleTokens::new(Duration::from_secs(300))
    }
}

impl SimpleTokens {
    pub(crate) fn new(ttl: Duration) -> SimpleTokens {
        SimpleTokens {
            tokens: Mutex::default(),
            ttl,
        }
    }

    pub(crate) fn set_ttl(&mut self, ttl: Duration) {
        self.ttl = ttl;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (String, Instant)>> {
        self.tokens.lock().expect("tokens lock poisoned")
    }

    /// Registers `token` for `user`; drops the tokens that expired meanwhile.
    pub(crate) fn register(&self, token: String, user: String, now: Instant) {
        let mut tokens = self.lock();
        tokens.retain(|_, (_, expiry)| *expiry > now);
        tokens.insert(token, (user, now + self.ttl));
    }

    /// The user `token` belongs to, if it is known and has not expired; pushes its expiry.
    pub(crate) fn user(&self, token: &str, now: Instant) -> Option<String> {
        let mut tokens = self.lock();
        let (user, expiry) = tokens.get_mut(token)?;
        if *expiry <= now {
            tokens.remove(token);
            return None;
        }
        *expiry = now + self.ttl;
        Some(user.clone())
    }

    pub(crate) fn end_user(&self, user: &str) {
        self.lock().retain(|_, (u, _)| u != user);
    }

    pub(crate) fn end_all(&self) {
        self.lock().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_lives_while_it_is_used() {
        let t = SimpleTokens::new(Duration::from_secs(10));
        let start = Instant::now();
        t.register("a.1".into(), "alice".into(), start);
        let at = |s| start + Duration::from_secs(s);
        assert_eq!(t.user("a.1", at(9)).as_deref(), Some("alice"));
        assert_eq!(
            t.user("a.1", at(18)).as_deref(),
            Some("alice"),
            "used at 9: lives to 19"
        );
        assert_eq!(t.user("a.1", at(29)), None, "idle for 11 s");
        assert_eq!(t.user("nope", at(1)), None);
        t.register("b.2".into(), "bob".into(), start);
        t.register("c.3".into(), "alice".into(), start);
        t.end_user("alice");
        assert_eq!(t.user("c.3", at(1)), None);
        assert_eq!(t.user("b.2", at(1)).as_deref(), Some("bob"));
        t.end_all();
        assert_eq!(t.user("b.2", at(1)), None);
    }
}
