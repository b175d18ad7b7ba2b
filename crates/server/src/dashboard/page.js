// The leasehold dashboard. The server pushes the page's state as Server-Sent Events
// (dashboard/events); this script only draws it. Countdowns run here: each lease comes with the
// milliseconds it had left when it was read, which become a deadline on this browser's monotonic
// clock, so the server sends nothing per second. Every text from the server goes in with
// textContent, never as markup.
'use strict';

(() => {
  const SVG = 'http://www.w3.org/2000/svg';
  const TICK_MS = 200;
  const $ = (id) => document.getElementById(id);

  const params = new URLSearchParams(location.search);
  let source = null;
  let state = null;
  // performance.now() when `state` arrived: the origin of every countdown.
  let receivedAt = 0;

  function el(tag, text, className) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (className) node.className = className;
    return node;
  }

  function fill(tbody, rows) {
    tbody.replaceChildren(...rows);
  }

  function seconds(ms) {
    if (ms <= 0) return '0 s';
    return Math.floor(ms / 1000) + ' s';
  }

  function ago(ms) {
    const s = Math.floor(ms / 1000);
    if (s < 60) return s + ' s ago';
    if (s < 3600) return Math.floor(s / 60) + ' min ' + (s % 60) + ' s ago';
    return Math.floor(s / 3600) + ' h ' + Math.floor((s % 3600) / 60) + ' min ago';
  }

  function number(n) {
    return Number(n).toLocaleString('en-US');
  }

  // --- connection -----------------------------------------------------------------------------

  function show(json) {
    state = JSON.parse(json);
    receivedAt = performance.now();
    document.body.dataset.state = 'live';
    $('conn').textContent = 'live';
    $('error').hidden = true;
    render();
  }

  // `keep`: what is shown stays until the stream's first state replaces it (the state the page
  // was served with); otherwise the page says it is connecting (another page of leases).
  function connect(keep) {
    if (source) source.close();
    const qs = params.toString();
    history.replaceState(null, '', qs ? '?' + qs : location.pathname);
    if (!keep) {
      document.body.dataset.state = 'connecting';
      $('conn').textContent = 'connecting…';
    }
    source = new EventSource('dashboard/events' + (qs ? '?' + qs : ''));
    source.addEventListener('state', (event) => show(event.data));
    source.addEventListener('error', () => {
      if (source.readyState === EventSource.CLOSED) {
        // Refused (a bad query, too many pages open): ask the same endpoint once more to show
        // why, and hang up at once if it would stream this time.
        document.body.dataset.state = 'closed';
        $('conn').textContent = 'disconnected';
        const ask = new AbortController();
        fetch('dashboard/events' + (qs ? '?' + qs : ''), { signal: ask.signal })
          .then((r) => {
            if (r.ok) {
              ask.abort();
              return null;
            }
            return r.text();
          })
          .then((why) => {
            if (why) {
              $('error').textContent = why;
              $('error').hidden = false;
            }
          })
          .catch(() => {});
      } else {
        // EventSource reconnects by itself.
        document.body.dataset.state = 'reconnecting';
        $('conn').textContent = 'reconnecting…';
      }
    });
  }

  // --- drawing --------------------------------------------------------------------------------

  function render() {
    renderMembers();
    renderLeases();
    renderQueues();
    renderRecent();
    tick();
  }

  function renderMembers() {
    const m = state.members;
    $('member').textContent = (m.this.name || m.this.id) + ' · revision ' + state.revision;
    const leader = m.this.leader ? m.this.leader : 'none';
    $('raft').textContent =
      'This member: term ' + m.this.term + ' · applied index ' + m.this.applied_index +
      ' · last log index ' + m.this.last_log_index + ' · leader ' + leader;
    fill($('members').tBodies[0], m.list.map((member) => {
      const tr = el('tr');
      tr.dataset.member = member.id;
      tr.append(el('td', member.id, 'mono'), el('td', member.name), el('td', member.peer_url, 'mono'));
      const role = el('td');
      if (member.leader) role.append(el('span', 'leader', 'badge leader'), ' ');
      else role.append(el('span', member.learner ? 'learner' : 'follower', 'badge'), ' ');
      if (member.this) role.append(el('span', 'this member', 'badge this'));
      tr.append(role);
      return tr;
    }));
  }

  function renderLeases() {
    const leases = state.leases;
    const page = leases.page;
    $('lease-count').textContent = number(leases.total) + ' live';
    $('values').checked = state.values;
    if (page.search) {
      $('range').textContent = page.rows.length ? 'lease ' + page.search : 'lease ' + page.search + ' not found';
    } else if (page.total === 0) {
      $('range').textContent = '';
    } else {
      const first = Math.min(page.offset + 1, page.total);
      const last = Math.min(page.offset + page.rows.length, page.total);
      $('range').textContent = number(first) + '–' + number(last) + ' of ' + number(page.total) + ', soonest first';
    }
    $('prev').disabled = !!page.search || page.offset === 0;
    $('next').disabled = !!page.search || page.offset + page.rows.length >= page.total;
    $('leases-empty').hidden = page.rows.length > 0;
    fill($('leases').tBodies[0], page.rows.map((lease) => {
      const tr = el('tr');
      tr.dataset.lease = lease.id;
      tr.dataset.deadline = String(receivedAt + lease.remaining_ms);
      tr.dataset.ttl = String(lease.ttl);
      const left = el('td', null, 'ttl-left');
      const bar = el('span', null, 'bar');
      bar.append(el('span'));
      left.append(bar, el('span', '', 'ttl-text'));
      const keys = el('td');
      const list = el('ul', null, 'keys');
      for (const key of lease.keys) list.append(el('li', key));
      if (lease.keys_total > lease.keys.length) {
        list.append(el('li', '… ' + number(lease.keys_total - lease.keys.length) + ' more', 'more'));
      }
      keys.append(list);
      tr.append(el('td', lease.id, 'mono'), el('td', lease.id_dec, 'mono num'),
        el('td', lease.ttl + ' s', 'num'), left, keys);
      return tr;
    }));
  }

  function shownValue(entry) {
    if (entry.value === null) return el('span', 'hidden (' + number(entry.value_bytes) + ' bytes)', 'hidden-value');
    return el('span', entry.value, 'mono');
  }

  function renderQueues() {
    fill($('locks').tBodies[0], state.locks.map((lock) => {
      const tr = el('tr');
      tr.dataset.lock = lock.name;
      const waiters = el('ol', null, 'waiters');
      for (const w of lock.waiters) {
        const li = el('li', w.key + ' (lease ' + w.lease + ', rev ' + w.revision + ')', 'mono');
        li.dataset.lease = w.lease || '';
        waiters.append(li);
      }
      if (lock.waiters_total > lock.waiters.length) {
        waiters.append(el('li', '… ' + number(lock.waiters_total - lock.waiters.length) + ' more', 'more'));
      }
      const cell = el('td');
      if (lock.waiters_total === 0) cell.append(el('span', 'none', 'note'));
      else cell.append(waiters);
      const holderLease = el('td', lock.holder.lease || '(none)', 'mono holder-lease');
      tr.append(el('td', lock.name, 'mono'), el('td', lock.holder.key, 'mono'), holderLease,
        el('td', lock.holder.revision, 'num fencing'), cell);
      return tr;
    }));
    $('locks-empty').hidden = state.locks.length > 0;
    fill($('elections').tBodies[0], state.elections.map((election) => {
      const tr = el('tr');
      tr.dataset.election = election.name;
      const value = el('td', null, 'proclaimed');
      value.append(shownValue(election.holder));
      tr.append(el('td', election.name, 'mono'), el('td', election.holder.key, 'mono'),
        el('td', election.holder.lease || '(none)', 'mono'), el('td', election.holder.revision, 'num'),
        value, el('td', election.waiters_total + 1, 'num'));
      return tr;
    }));
    $('elections-empty').hidden = state.elections.length > 0;
    const shown = state.locks.length + state.elections.length;
    $('queues-note').textContent = state.queues_more || state.queues_found > shown
      ? 'Showing ' + shown + ' of ' + (state.queues_more ? 'more than ' : '') + number(state.queues_found) + ' locks and elections (first by name).'
      : '';
  }

  function renderRecent() {
    fill($('recent').tBodies[0], state.recent.map((ended) => {
      const tr = el('tr');
      tr.dataset.lease = ended.id;
      tr.dataset.how = ended.how;
      const when = el('td', '', 'ago');
      when.dataset.at = String(receivedAt - ended.ago_ms);
      tr.append(el('td', ended.id, 'mono'), el('td', ended.how, 'how-' + ended.how), when,
        el('td', ended.ttl + ' s', 'num'), el('td', ended.keys, 'num'));
      return tr;
    }));
    $('recent-empty').hidden = state.recent.length > 0;
  }

  // Runs every TICK_MS: countdowns, "ago" times and the chart move with the clock alone.
  function tick() {
    if (!state) return;
    const now = performance.now();
    for (const tr of $('leases').tBodies[0].rows) {
      const left = Number(tr.dataset.deadline) - now;
      const cell = tr.querySelector('.ttl-left');
      cell.classList.toggle('expiring', left <= 0);
      cell.querySelector('.ttl-text').textContent = left <= 0 ? 'expiring' : seconds(left);
      const full = Number(tr.dataset.ttl) * 1000;
      const fraction = full > 0 ? Math.max(0, Math.min(1, left / full)) : 0;
      cell.querySelector('.bar > span').style.width = (fraction * 100).toFixed(1) + '%';
    }
    for (const td of $('recent').querySelectorAll('td.ago')) {
      td.textContent = ago(now - Number(td.dataset.at));
    }
    drawChart(now - receivedAt);
  }

  function drawChart(elapsedMs) {
    const h = state.leases.histogram;
    const svg = $('chart');
    const width = 640;
    const top = 8;
    const base = 104;
    const span = h.buckets.length * h.bucket_ms;
    const max = Math.max(1, ...h.buckets);
    const nodes = [];
    const line = document.createElementNS(SVG, 'line');
    for (const [k, v] of Object.entries({ x1: 0, y1: base, x2: width, y2: base })) line.setAttribute(k, v);
    line.setAttribute('class', 'axis');
    nodes.push(line);
    const barWidth = width / h.buckets.length;
    h.buckets.forEach((count, i) => {
      if (count === 0) return;
      // Bucket i starts i buckets after the state was read; slide left as time passes.
      const x = ((i * h.bucket_ms - elapsedMs) / span) * width;
      if (x + barWidth <= 0) return;
      const height = (count / max) * (base - top);
      const rect = document.createElementNS(SVG, 'rect');
      rect.setAttribute('class', 'bucket');
      rect.setAttribute('x', Math.max(0, x).toFixed(1));
      rect.setAttribute('y', (base - height).toFixed(1));
      rect.setAttribute('width', Math.max(1, barWidth - 1 + Math.min(0, x)).toFixed(1));
      rect.setAttribute('height', height.toFixed(1));
      const title = document.createElementNS(SVG, 'title');
      title.textContent = count + ' due in ' + Math.max(0, Math.round((i * h.bucket_ms - elapsedMs) / 1000)) + '–' +
        Math.max(0, Math.round(((i + 1) * h.bucket_ms - elapsedMs) / 1000)) + ' s';
      rect.append(title);
      nodes.push(rect);
    });
    for (const s of [0, 15, 30, 45, 60]) {
      const text = document.createElementNS(SVG, 'text');
      text.setAttribute('x', Math.min(width - 24, (s / 60) * width).toFixed(1));
      text.setAttribute('y', String(base + 16));
      text.textContent = s === 0 ? 'now' : '+' + s + ' s';
      nodes.push(text);
    }
    const peak = document.createElementNS(SVG, 'text');
    peak.setAttribute('x', '2');
    peak.setAttribute('y', String(top + 4));
    peak.textContent = 'max ' + max + '/s';
    nodes.push(peak);
    svg.replaceChildren(...nodes);
    const inWindow = h.buckets.reduce((a, b) => a + b, 0);
    $('chart-note').textContent = number(inWindow) + ' due within 60 s · ' + number(h.later) + ' later · ' +
      number(h.overdue) + ' overdue (deadline passed, revoke not yet applied here)';
  }

  // --- controls -------------------------------------------------------------------------------

  function pageBy(step) {
    if (!state) return;
    const page = state.leases.page;
    const offset = Math.max(0, page.offset + step * page.limit);
    if (offset === 0) params.delete('offset');
    else params.set('offset', String(offset));
    connect();
  }

  $('controls').addEventListener('submit', (event) => {
    event.preventDefault();
    const wanted = $('search').value.trim();
    params.delete('offset');
    if (wanted) params.set('lease', wanted);
    else params.delete('lease');
    connect();
  });
  $('all').addEventListener('click', () => {
    $('search').value = '';
    params.delete('lease');
    params.delete('offset');
    connect();
  });
  $('prev').addEventListener('click', () => pageBy(-1));
  $('next').addEventListener('click', () => pageBy(1));
  $('values').addEventListener('change', () => {
    if ($('values').checked) params.set('values', '1');
    else params.delete('values');
    connect();
  });

  $('search').value = params.get('lease') || '';
  setInterval(tick, TICK_MS);
  // The first paint draws the state the page came with, so it never waits for the stream; the
  // stream then brings every newer state.
  const initial = $('initial-state');
  const served = initial !== null && initial.textContent !== '';
  if (served) show(initial.textContent);
  connect(served);
})();
