//! Headless Chromium for the tests that look at a page, driven over the Chrome DevTools Protocol
//! (JSON over a WebSocket) by the few commands they need: open a page, evaluate an expression,
//! wait for one to hold, take a screenshot.
//!
//! No port race: Chromium picks its own DevTools port (`--remote-debugging-port=0`) and writes
//! it to `DevToolsActivePort` in its profile directory, which the harness reads. The browser
//! runs in a process group of its own, SIGKILLed with its renderers on drop (also while a test
//! unwinds). Debian's `chromium` runs as root here, hence `--no-sandbox`; `scripts/test.sh`
//! installs it. `LEASEHOLD_CHROMIUM=<path>` runs another build.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use futures::{SinkExt as _, StreamExt as _};
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::sync::oneshot;
use tokio_tungstenite::tungstenite::Message;

/// How long Chromium has to start and write its DevTools port.
pub const BROWSER_START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one DevTools command may take.
pub const CDP_CALL_TIMEOUT: Duration = Duration::from_secs(15);
/// How often [`Page::wait_for`] evaluates its condition.
const WAIT_POLL_INTERVAL: Duration = Duration::from_millis(100);
/// The window the pages are laid out in (and screenshots taken at).
const VIEWPORT: (u32, u32) = (1280, 900);

const CHROMIUM_VAR: &str = "LEASEHOLD_CHROMIUM";
const MISSING_CHROMIUM: &str = "is not on PATH. The dashboard test drives a real headless \
     Chromium (Debian package chromium): run scripts/test.sh, which installs it, or \
     `apt-get install --no-install-recommends chromium`.";

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Value>>>>;
type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A headless Chromium and its DevTools connection; killed on drop.
pub struct Browser {
    child: Option<Child>,
    profile: TempDir,
    log_path: PathBuf,
    cdp: Arc<Cdp>,
}

/// The browser's DevTools connection: numbered commands, each answer given to its caller.
struct Cdp {
    sink: tokio::sync::Mutex<futures::stream::SplitSink<Socket, Message>>,
    pending: Pending,
    next_id: AtomicU64,
    reader: tokio::task::JoinHandle<()>,
}

impl Cdp {
    async fn call(&self, session: Option<&str>, method: &str, params: Value) -> Value {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().expect("pending lock").insert(id, tx);
        let mut message = json!({ "id": id, "method": method, "params": params });
        if let Some(session) = session {
            message["sessionId"] = Value::from(session);
        }
        self.sink
            .lock()
            .await
            .send(Message::text(message.to_string()))
            .await
            .unwrap_or_else(|e| panic!("DevTools {method}: send: {e}"));
        let answer = tokio::time::timeout(CDP_CALL_TIMEOUT, rx)
            .await
            .unwrap_or_else(|_| panic!("DevTools {method}: no answer within {CDP_CALL_TIMEOUT:?}"))
            .unwrap_or_else(|_| panic!("DevTools {method}: the connection closed"));
        if let Some(error) = answer.get("error") {
            panic!("DevTools {method} failed: {error}");
        }
        answer["result"].clone()
    }
}

/// The chromium binary: `$LEASEHOLD_CHROMIUM`, else `chromium` on PATH.
fn chromium_binary() -> PathBuf {
    let binary = std::env::var_os(CHROMIUM_VAR)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("chromium"));
    if std::env::var_os(CHROMIUM_VAR).is_none() && !on_path(&binary) {
        panic!("chromium {MISSING_CHROMIUM}");
    }
    binary
}

/// Loads `url` in a fresh headless Chromium (its own new profile) with `--dump-dom`, as a user
/// checking a page from a shell does, and returns the DOM it printed once the page had loaded,
/// with how long the whole run took. Blocking; Chromium's own `--timeout` bounds the load.
pub fn dump_dom(url: &str) -> (String, Duration) {
    let profile = tempfile::Builder::new()
        .prefix("leasehold-chromium.")
        .tempdir()
        .expect("chromium profile dir");
    let started = Instant::now();
    let output = Command::new(chromium_binary())
        .args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--disable-extensions",
            "--disable-background-networking",
            "--timeout=10000",
            &format!("--user-data-dir={}", profile.path().display()),
            "--dump-dom",
            url,
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .expect("run chromium --dump-dom");
    assert!(
        output.status.success(),
        "chromium --dump-dom {url}: {}",
        output.status
    );
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        started.elapsed(),
    )
}

impl Browser {
    /// Starts headless Chromium with a fresh profile; returns once its DevTools answer.
    pub async fn start() -> Browser {
        let binary = chromium_binary();
        let profile = tempfile::Builder::new()
            .prefix("leasehold-chromium.")
            .tempdir()
            .expect("chromium profile dir");
        let log_path = profile.path().join("chromium.log");
        let log = std::fs::File::create(&log_path).expect("chromium log");
        let child = {
            use std::os::unix::process::CommandExt as _;
            Command::new(&binary)
                .args([
                    "--headless=new",
                    // Runs as root in the test container: Chromium's sandbox refuses root.
                    "--no-sandbox",
                    "--disable-gpu",
                    // Containers often have a small /dev/shm.
                    "--disable-dev-shm-usage",
                    "--remote-debugging-port=0",
                    "--no-first-run",
                    "--no-default-browser-check",
                    "--disable-extensions",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                    "--mute-audio",
                    "--hide-scrollbars",
                    &format!("--window-size={},{}", VIEWPORT.0, VIEWPORT.1),
                    &format!("--user-data-dir={}", profile.path().display()),
                    "about:blank",
                ])
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log handle"))
                .stderr(log)
                // Its own process group, so drop kills the renderers and helpers too.
                .process_group(0)
                .spawn()
                .unwrap_or_else(|e| panic!("start {}: {e}", binary.display()))
        };
        let mut browser_guard = BrowserGuard {
            child: Some(child),
            log_path: log_path.clone(),
        };
        let ws_url = browser_guard.wait_for_port(profile.path()).await;
        let (socket, _) =
            tokio::time::timeout(CDP_CALL_TIMEOUT, tokio_tungstenite::connect_async(&ws_url))
                .await
                .unwrap_or_else(|_| browser_guard.fail("DevTools WebSocket: connect timed out"))
                .unwrap_or_else(|e| {
                    browser_guard.fail(&format!("DevTools WebSocket {ws_url}: {e}"))
                });
        let (sink, mut stream) = socket.split();
        let pending: Pending = Arc::default();
        let reader = {
            let pending = pending.clone();
            tokio::spawn(async move {
                while let Some(Ok(message)) = stream.next().await {
                    let Message::Text(text) = message else {
                        continue;
                    };
                    let Ok(value) = serde_json::from_str::<Value>(text.as_str()) else {
                        continue;
                    };
                    // Answers carry their command's id; events (no id) are not needed here.
                    if let Some(id) = value.get("id").and_then(Value::as_u64)
                        && let Some(tx) = pending.lock().expect("pending lock").remove(&id)
                    {
                        let _ = tx.send(value);
                    }
                }
                // Closed: callers waiting for an answer see their sender dropped.
                pending.lock().expect("pending lock").clear();
            })
        };
        Browser {
            child: browser_guard.child.take(),
            profile,
            log_path,
            cdp: Arc::new(Cdp {
                sink: tokio::sync::Mutex::new(sink),
                pending,
                next_id: AtomicU64::new(1),
                reader,
            }),
        }
    }

    /// Opens a new tab at `url` and waits for its document to load.
    pub async fn open(&self, url: &str) -> Page {
        self.open_blocking(url, &[]).await
    }

    /// As [`Browser::open`], with requests to URLs matching any of `blocked` (DevTools patterns,
    /// `*` a wildcard) failing as if the network refused them.
    pub async fn open_blocking(&self, url: &str, blocked: &[&str]) -> Page {
        let target = self
            .cdp
            .call(None, "Target.createTarget", json!({ "url": "about:blank" }))
            .await;
        let target_id = target["targetId"].as_str().expect("targetId").to_owned();
        let attached = self
            .cdp
            .call(
                None,
                "Target.attachToTarget",
                json!({ "targetId": target_id, "flatten": true }),
            )
            .await;
        let session = attached["sessionId"]
            .as_str()
            .expect("sessionId")
            .to_owned();
        let page = Page {
            cdp: self.cdp.clone(),
            session,
        };
        page.call(
            "Emulation.setDeviceMetricsOverride",
            json!({ "width": VIEWPORT.0, "height": VIEWPORT.1, "deviceScaleFactor": 1, "mobile": false }),
        )
        .await;
        if !blocked.is_empty() {
            page.call("Network.enable", json!({})).await;
            page.call("Network.setBlockedURLs", json!({ "urls": blocked }))
                .await;
        }
        page.call("Page.navigate", json!({ "url": url })).await;
        page.wait_for(
            "the document to load",
            "document.readyState === 'complete' && location.href !== 'about:blank'",
            Duration::from_secs(20),
        )
        .await;
        page
    }

    /// The browser's own output so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// The browser's profile directory, removed on drop.
    pub fn profile_dir(&self) -> &Path {
        self.profile.path()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        self.cdp.reader.abort();
        if let Some(child) = self.child.take() {
            kill_group(child);
        }
    }
}

/// Kills a starting browser if the start fails (drop) and explains failures with its log.
struct BrowserGuard {
    child: Option<Child>,
    log_path: PathBuf,
}

impl BrowserGuard {
    /// The browser-wide DevTools WebSocket URL, from `DevToolsActivePort` (port, then path).
    async fn wait_for_port(&mut self, profile: &Path) -> String {
        let file = profile.join("DevToolsActivePort");
        let started = Instant::now();
        loop {
            if let Ok(text) = std::fs::read_to_string(&file) {
                let mut lines = text.lines();
                if let (Some(port), Some(path)) = (lines.next(), lines.next())
                    && port.parse::<u16>().is_ok()
                {
                    return format!("ws://127.0.0.1:{port}{path}");
                }
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.fail(&format!("chromium exited at start: {status}"));
            }
            if started.elapsed() > BROWSER_START_TIMEOUT {
                self.fail(&format!(
                    "no DevToolsActivePort within {BROWSER_START_TIMEOUT:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn fail(&self, message: &str) -> ! {
        let log = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        panic!("{message}\n----- chromium log -----\n{log}\n----- end of chromium log -----");
    }
}

impl Drop for BrowserGuard {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            kill_group(child);
        }
    }
}

/// SIGKILLs the browser's process group (the browser, its renderers and helpers) and reaps it.
fn kill_group(mut child: Child) {
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{}", child.id())])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    let _ = child.kill();
    let _ = child.wait();
}

fn on_path(binary: &Path) -> bool {
    if binary.components().count() > 1 {
        return binary.exists();
    }
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(binary).is_file()))
}

/// One tab.
pub struct Page {
    cdp: Arc<Cdp>,
    session: String,
}

impl Page {
    async fn call(&self, method: &str, params: Value) -> Value {
        self.cdp.call(Some(&self.session), method, params).await
    }

    /// Evaluates `expression` in the page (awaiting a promise) and returns its value as JSON.
    pub async fn eval(&self, expression: &str) -> Value {
        let result = self
            .call(
                "Runtime.evaluate",
                json!({ "expression": expression, "returnByValue": true, "awaitPromise": true }),
            )
            .await;
        if let Some(exception) = result.get("exceptionDetails") {
            panic!("evaluating `{expression}` threw: {exception}");
        }
        result["result"]["value"].clone()
    }

    /// Evaluates `expression` every 100 ms until it gives something other than `null`,
    /// `undefined`, `false` or `""`, and returns that; panics naming `what` (and the last
    /// value seen) after `within`.
    pub async fn wait_for(&self, what: &str, expression: &str, within: Duration) -> Value {
        let started = Instant::now();
        loop {
            let value = self.eval(expression).await;
            let holds =
                !matches!(&value, Value::Null | Value::Bool(false)) && value.as_str() != Some("");
            if holds {
                return value;
            }
            if started.elapsed() > within {
                let body = self
                    .eval("document.body ? document.body.innerText.slice(0, 4000) : ''")
                    .await;
                panic!(
                    "waited {within:?} for {what} (`{expression}` was {value}); the page says:\n{}",
                    body.as_str().unwrap_or_default()
                );
            }
            tokio::time::sleep(WAIT_POLL_INTERVAL).await;
        }
    }

    /// Saves a PNG of the whole page (not only the window) to `path`.
    pub async fn screenshot(&self, path: &Path) {
        let height = self
            .eval("Math.ceil(document.documentElement.scrollHeight)")
            .await
            .as_u64()
            .unwrap_or(u64::from(VIEWPORT.1))
            .clamp(u64::from(VIEWPORT.1), 4_000);
        self.call(
            "Emulation.setDeviceMetricsOverride",
            json!({ "width": VIEWPORT.0, "height": height, "deviceScaleFactor": 1, "mobile": false }),
        )
        .await;
        let shot = self
            .call("Page.captureScreenshot", json!({ "format": "png" }))
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().expect("screenshot data"))
            .expect("screenshot is base64");
        if let Some(dir) = path.parent()
            && !dir.as_os_str().is_empty()
        {
            std::fs::create_dir_all(dir).expect("screenshot dir");
        }
        std::fs::write(path, png).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        self.call(
            "Emulation.setDeviceMetricsOverride",
            json!({ "width": VIEWPORT.0, "height": VIEWPORT.1, "deviceScaleFactor": 1, "mobile": false }),
        )
        .await;
    }
}
