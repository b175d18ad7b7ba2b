//! The live lease dashboard on the client port (docs/dashboard.md): one page at `/dashboard`,
//! its script and style, and `/dashboard/events`, a Server-Sent Events stream of the page's state.
//!
//! ```text
//!   apply ─► revision published ──┐
//!   apply ─► lease table moved ────┤
//!   new term or leader ────────────┼─► Hub task (one per listener, only while a
//!   heartbeat (10 s) ──────────────┘   page is open; at most 4 updates/s)
//!        read_local: a bounded copy (first page, histogram, recent ends) ─► Summary
//!        queue scan: 4,096 keys per read of the state, then one range per queue
//!        ─► watch channel (the latest Summary only) ─► each page's SSE stream ─► browser
//! ```
//!
//! Invariants: a page costs a watch receiver and, when it asks for its own lease page (offset or
//! search), one bounded read per update; a slow page only ever has the latest summary waiting
//! for it, so it never holds up writers or other pages; at most [`EVENT_STREAMS_MAX`] streams
//! at once. Everything is read from this member's applied state, so the page works on any member
//! (a follower shows what it has applied). Lock order: the state lock is only ever taken inside
//! `Replica::read_local`, never with another lock held.

mod view;

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::Stream;
use serde_json::{Value, json};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use crate::context::ServerContext;
use crate::health;
use view::{Query, Summary};

/// Event streams open at once on this member; more get 503.
const EVENT_STREAMS_MAX: usize = 64;
/// The least time between two updates: a busy store gives at most 4 updates per second.
const UPDATE_INTERVAL_MIN: Duration = Duration::from_millis(250);
/// An update at least this often even when nothing changed: the page re-syncs its countdowns
/// and proxies see traffic.
const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(10);
/// Keys looked at per read of the state while finding queue names.
const SCAN_KEYS_PER_READ: usize = 4_096;
/// How long `/dashboard/state` waits for the first summary.
const STATE_WAIT_MAX: Duration = Duration::from_secs(5);

const PAGE_HTML: &str = include_str!("dashboard/page.html");
const PAGE_JS: &str = include_str!("dashboard/page.js");
const PAGE_CSS: &str = include_str!("dashboard/page.css");

/// The page's own files only: no inline script, nothing from elsewhere.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'self'; \
     frame-ancestors 'none'";

/// The dashboard's routes, to merge into the client port's router.
pub(crate) fn router(ctx: Arc<ServerContext>) -> Router {
    let hub = Arc::new(Hub::new(ctx));
    Router::new()
        .route("/dashboard", get(page).fallback(health::method_not_allowed))
        .route(
            "/dashboard/",
            get(to_page).fallback(health::method_not_allowed),
        )
        .route(
            "/dashboard/page.js",
            get(script).fallback(health::method_not_allowed),
        )
        .route(
            "/dashboard/page.css",
            get(style).fallback(health::method_not_allowed),
        )
        .route(
            "/dashboard/events",
            get(events).fallback(health::method_not_allowed),
        )
        .route(
            "/dashboard/state",
            get(state).fallback(health::method_not_allowed),
        )
        .with_state(hub)
}

/// The auth hook. leasehold has no auth yet (issue 13), so every request may see the dashboard,
/// as every client may read every key. When auth lands this must require a token with read
/// access to the whole key space (from an `Authorization` header, or a cookie the page sets,
/// since `EventSource` cannot send headers) and answer 401 otherwise; every handler below
/// already calls it first.
fn authorize(_hub: &Hub, _headers: &HeaderMap) -> Result<(), Response> {
    Ok(())
}

fn asset(content_type: &'static str, body: impl IntoResponse) -> Response {
    let headers = [
        (header::CONTENT_TYPE, content_type),
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::CACHE_CONTROL, "no-cache"),
    ];
    (StatusCode::OK, headers, body).into_response()
}

fn plain(status: StatusCode, body: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body,
    )
        .into_response()
}

/// The page, with the state it first shows inside it (as the `state` event would bring it, for
/// the page's own query), so its first paint never waits for the event stream: a browser that
/// draws at its load event, before the stream's first event arrived, showed "connecting…"
/// with nothing else. Without a state within [`STATE_WAIT_MAX`], or for a query the events
/// endpoint refuses, the page comes without one and waits for the stream (which shows why).
async fn page(
    State(hub): State<Arc<Hub>>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    if let Err(refused) = authorize(&hub, &headers) {
        return refused;
    }
    let initial = match Query::parse(raw.as_deref()) {
        Ok(query) => {
            let mut updates = hub.subscribe();
            let first =
                tokio::time::timeout(STATE_WAIT_MAX, updates.wait_for(Option::is_some)).await;
            match first {
                Ok(Ok(summary)) => {
                    let summary = summary.clone().expect("waited for it");
                    Some(hub.render(&summary, &query))
                }
                _ => None,
            }
        }
        Err(_) => None,
    };
    asset(
        "text/html; charset=utf-8",
        with_initial_state(initial.as_deref()),
    )
}

/// The page's HTML with `state` (JSON) in its `initial-state` data block. A data block is not
/// run, so the page's Content-Security-Policy allows it; every `<` is escaped (`\u003c`, the
/// same JSON) so no text in the state can end the block.
fn with_initial_state(state: Option<&str>) -> String {
    let json = state.map(|s| s.replace('<', "\\u003c")).unwrap_or_default();
    PAGE_HTML.replacen(
        "</head>",
        &format!("<script id=\"initial-state\" type=\"application/json\">{json}</script>\n</head>"),
        1,
    )
}

/// `/dashboard/` to `/dashboard`, relative so that a proxy's path prefix is kept.
async fn to_page() -> Response {
    (
        StatusCode::PERMANENT_REDIRECT,
        [(header::LOCATION, "../dashboard")],
    )
        .into_response()
}

async fn script(State(hub): State<Arc<Hub>>, headers: HeaderMap) -> Response {
    if let Err(refused) = authorize(&hub, &headers) {
        return refused;
    }
    asset("text/javascript; charset=utf-8", PAGE_JS)
}

async fn style(State(hub): State<Arc<Hub>>, headers: HeaderMap) -> Response {
    if let Err(refused) = authorize(&hub, &headers) {
        return refused;
    }
    asset("text/css; charset=utf-8", PAGE_CSS)
}

/// What `events` and `state` check first: the caller may look ([`authorize`]), and the query
/// parses (400 with the reason if not).
fn admit(hub: &Hub, headers: &HeaderMap, raw: Option<&str>) -> Result<Query, Response> {
    authorize(hub, headers)?;
    Query::parse(raw).map_err(|why| plain(StatusCode::BAD_REQUEST, format!("{why}\n")))
}

/// `/dashboard/events?offset=&limit=&lease=&values=`: the page's state, now and after every
/// update, as `state` events.
async fn events(
    State(hub): State<Arc<Hub>>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    let query = match admit(&hub, &headers, raw.as_deref()) {
        Ok(query) => query,
        Err(refused) => return refused,
    };
    let Ok(permit) = hub.streams.clone().try_acquire_owned() else {
        return plain(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("at most {EVENT_STREAMS_MAX} dashboard streams at once\n"),
        );
    };
    let stream = event_stream(hub.clone(), hub.subscribe(), query, permit);
    let mut response = Sse::new(stream).into_response();
    // Proxies (nginx) must pass events on at once rather than buffer them.
    response.headers_mut().insert(
        header::HeaderName::from_static("x-accel-buffering"),
        header::HeaderValue::from_static("no"),
    );
    response
}

/// `/dashboard/state?...`: the state once, as JSON (for scripts and curl).
async fn state(
    State(hub): State<Arc<Hub>>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    let query = match admit(&hub, &headers, raw.as_deref()) {
        Ok(query) => query,
        Err(refused) => return refused,
    };
    let mut updates = hub.subscribe();
    let first = tokio::time::timeout(STATE_WAIT_MAX, updates.wait_for(Option::is_some)).await;
    let summary = match first {
        Ok(Ok(summary)) => summary.clone().expect("waited for it"),
        _ => {
            return plain(
                StatusCode::SERVICE_UNAVAILABLE,
                "the dashboard's state is not ready\n".to_owned(),
            );
        }
    };
    let body = hub.render(&summary, &query);
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

type Latest = Option<Arc<Summary>>;

/// One page's stream: the latest summary at once, then one event per newer summary, until the
/// page goes or the member stops. A page that reads slowly skips summaries: only the latest
/// waits for it.
fn event_stream(
    hub: Arc<Hub>,
    updates: watch::Receiver<Latest>,
    query: Query,
    permit: OwnedSemaphorePermit,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let state = (hub, updates, query, permit, true);
    futures::stream::unfold(
        state,
        |(hub, mut updates, query, permit, first)| async move {
            let mut first = first;
            let summary = loop {
                let next = async {
                    if first {
                        updates.wait_for(Option::is_some).await.map(|_| ())
                    } else {
                        updates.changed().await
                    }
                };
                tokio::select! {
                    next = next => {
                        if next.is_err() {
                            return None;
                        }
                    }
                    () = hub.ctx.replica.stopping() => return None,
                }
                first = false;
                // Marks this summary seen: the next wait is for a newer one. `None` means the
                // hub stopped meanwhile; a newer summary follows.
                if let Some(summary) = updates.borrow_and_update().clone() {
                    break summary;
                }
            };
            let data = hub.render(&summary, &query);
            let event = Event::default().event("state").data(data);
            Some((Ok(event), (hub, updates, query, permit, false)))
        },
    )
}

/// The task that computes the dashboard's state while someone watches: one per client listener
/// (each `serve` builds its router), so one per member unless several client URLs are given.
struct Hub {
    ctx: Arc<ServerContext>,
    latest: watch::Sender<Latest>,
    /// Whether the task runs; checked and set together with the receiver count (see
    /// [`Hub::subscribe`]).
    running: Mutex<bool>,
    streams: Arc<Semaphore>,
}

impl Hub {
    fn new(ctx: Arc<ServerContext>) -> Hub {
        Hub {
            ctx,
            latest: watch::Sender::new(None),
            running: Mutex::new(false),
            streams: Arc::new(Semaphore::new(EVENT_STREAMS_MAX)),
        }
    }

    /// A receiver of the summaries; starts the task if nobody watched until now.
    fn subscribe(self: &Arc<Hub>) -> watch::Receiver<Latest> {
        let mut running = self.running.lock().expect("hub lock poisoned");
        let updates = self.latest.subscribe();
        if !*running {
            *running = true;
            tokio::spawn(self.clone().run());
        }
        updates
    }

    /// The view's JSON: the shared summary with its own lease page.
    fn render(&self, summary: &Summary, query: &Query) -> String {
        if query.is_first_page() {
            return summary.to_json(&summary.first_page, query.values);
        }
        let page = self
            .ctx
            .replica
            .read_local(|_, leases, _| view::lease_page(leases, query));
        summary.to_json(&page, query.values)
    }

    /// Computes a summary after every change (at most every [`UPDATE_INTERVAL_MIN`]) and at
    /// least every [`HEARTBEAT_INTERVAL`], until nobody watches or the member stops. Woken by
    /// what it shows: a new revision, an apply that touched a lease, a new term or leader.
    async fn run(self: Arc<Hub>) {
        let replica = self.ctx.replica.clone();
        let mut revisions = replica.subscribe_revisions();
        let mut lease_changes = replica.subscribe_lease_changes();
        let mut leadership = replica.subscribe_leadership();
        // Due at once: the first watcher waits for a first summary.
        let mut moved = true;
        let mut published_at: Option<Instant> = None;
        loop {
            {
                let mut running = self.running.lock().expect("hub lock poisoned");
                if self.latest.receiver_count() == 0 || replica.is_stopping() {
                    *running = false;
                    self.latest.send_replace(None);
                    return;
                }
            }
            moved |= revisions.has_changed().unwrap_or(false);
            moved |= lease_changes.has_changed().unwrap_or(false);
            revisions.mark_unchanged();
            lease_changes.mark_unchanged();
            let heartbeat_at = published_at.map_or_else(Instant::now, |at| at + HEARTBEAT_INTERVAL);
            if moved || Instant::now() >= heartbeat_at {
                moved = false;
                let summary = self.summarize().await;
                self.latest.send_replace(Some(Arc::new(summary)));
                published_at = Some(Instant::now());
                tokio::select! {
                    () = tokio::time::sleep(UPDATE_INTERVAL_MIN) => {}
                    () = replica.stopping() => {}
                }
                continue;
            }
            // `changed` marks what it saw as seen: the wake itself is the news.
            let gone = tokio::select! {
                changed = revisions.changed() => {
                    moved = true;
                    changed.is_err()
                }
                changed = lease_changes.changed() => {
                    moved = true;
                    changed.is_err()
                }
                changed = leadership.changed() => {
                    moved = true;
                    !changed
                }
                () = tokio::time::sleep_until(heartbeat_at.into()) => false,
                () = self.latest.closed() => false,
                () = replica.stopping() => false,
            };
            if gone {
                // The replica is gone.
                *self.running.lock().expect("hub lock poisoned") = false;
                return;
            }
        }
    }

    async fn summarize(&self) -> Summary {
        let replica = &self.ctx.replica;
        let at = Instant::now();
        let (now_ms, (revision, leases_len, histogram, first_page, recent)) = replica
            .read_local(|store, leases, now_ms| (now_ms, view::lease_parts(store, leases, now_ms)));
        // Queue names, in bounded steps, the state lock let go between them.
        let mut names = BTreeSet::new();
        let mut cursor = None;
        loop {
            let next = replica.read_local(|_, leases, _| {
                view::scan_queue_names(leases, cursor, SCAN_KEYS_PER_READ, &mut names)
            });
            match next {
                Some(after) => {
                    cursor = Some(after);
                    tokio::task::yield_now().await;
                }
                None => break,
            }
        }
        // The scan keeps one name more than it shows, to tell that there are more.
        let queue_names_more = names.len() > view::QUEUE_NAMES_MAX;
        if queue_names_more {
            names.pop_last();
        }
        let queue_names_len = names.len();
        let queues = replica.read_local(|store, _, _| {
            names
                .iter()
                .take(view::QUEUES_SHOWN_MAX)
                .filter_map(|name| view::queue(store, name))
                .collect()
        });
        Summary {
            revision,
            now_ms,
            at,
            leases_len,
            histogram,
            first_page,
            queues,
            queue_names_len,
            queue_names_more,
            recent,
            members: members_json(&self.ctx),
        }
    }
}

/// This member and the member list as this member sees them. Raft's indexes are this member's;
/// the others' are not known here.
fn members_json(ctx: &ServerContext) -> Value {
    let status = ctx.replica.status();
    let hex = |id: u64| format!("{id:x}");
    let members: Vec<Value> = ctx
        .replica
        .members()
        .iter()
        .map(|m| {
            let name = if m.id == ctx.member_id {
                ctx.name.clone()
            } else {
                ctx.member_names.get(&m.id).cloned().unwrap_or_default()
            };
            json!({
                "id": hex(m.id),
                "name": name,
                "peer_url": m.peer_url,
                "learner": m.learner,
                "leader": status.leader == Some(m.id),
                "this": m.id == ctx.member_id,
            })
        })
        .collect();
    json!({
        "this": {
            "id": hex(ctx.member_id),
            "name": ctx.name,
            "leader": status.leader.map(hex),
            "is_leader": status.leader == Some(ctx.member_id),
            "term": status.term,
            "applied_index": status.applied_index,
            "last_log_index": status.last_log_index,
        },
        "list": members,
    })
}

#[cfg(test)]
mod tests;
