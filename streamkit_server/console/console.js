// streamkit console: plain JavaScript, no framework, no build step.
// It uses only the coordinator's /coord/v1 API with a bearer token kept in
// sessionStorage (this tab only); the roles in the token decide what is enabled.
"use strict";

(() => {
  const API = "/coord/v1";
  const TOKEN_KEY = "streamkit.console.token";
  const params = new URLSearchParams(location.search);
  // ?poll=<ms> for a faster or slower live view (bounded, the API is shared).
  const POLL_MS = Math.min(Math.max(Number(params.get("poll")) || 1000, 250), 60000);
  const ROLE_ALIASES = { ADMIN: ["READ", "WRITE", "MEMBER"], MONITOR: ["READ"] };
  const FORWARD_STEPS = ["PREPARING", "ACTIVE", "DRAINING", "DEPRECATED"];
  const ROLLBACK_STEPS = ["ROLLING_BACK", "ROLLED_BACK"];
  const LIVE_MEMBER_STATES = new Set(["STARTING", "ACTIVE", "LEAVING"]);

  const $ = (id) => document.getElementById(id);

  /** Build an element; children are nodes or text (never parsed as HTML). */
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name === "class") el.className = value;
      else if (name === "text") el.textContent = value;
      else if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
      else el.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      el.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return el;
  }

  const fmt = {
    num: (v) => (v === null || v === undefined ? "?" : Number(v).toLocaleString("en-US")),
    rate: (v) => (v === null || v === undefined ? "…" : v.toFixed(1)),
    bytes(v) {
      if (v === null || v === undefined) return "?";
      const units = ["B", "KiB", "MiB", "GiB", "TiB"];
      let n = Number(v), i = 0;
      while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
      return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
    },
    ms: (v) => (v === null || v === undefined ? "—" : `${(v / 1000).toFixed(1)} s`),
    time(iso) {
      if (!iso) return "—";
      const d = new Date(iso);
      return Number.isNaN(d.getTime()) ? String(iso) : d.toISOString().replace("T", " ").slice(0, 19);
    },
    shards: (list) => (list && list.length ? list.map((s) => s.shardIndex ?? s).join(", ") : "—"),
  };

  // -- session -------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
    toString() {
      return this.code ? `${this.code}: ${this.message}` : this.message;
    }
  }

  /** The claims part of a token (the server signs it; the page only reads it). */
  function tokenClaims(token) {
    try {
      const part = token.split(".")[0].replace(/-/g, "+").replace(/_/g, "/");
      return JSON.parse(atob(part + "=".repeat((4 - (part.length % 4)) % 4)));
    } catch {
      return null;
    }
  }

  function sessionFrom(token) {
    const claims = token ? tokenClaims(token) : null;
    if (!claims || typeof claims.exp !== "number" || claims.exp * 1000 <= Date.now()) return null;
    const roles = new Set();
    for (const role of claims.roles || []) {
      for (const r of ROLE_ALIASES[role] || [role]) roles.add(r);
    }
    return { token, user: String(claims.sub || "?"), roles, expiresAt: claims.exp * 1000 };
  }

  let session = sessionFrom(sessionStorage.getItem(TOKEN_KEY));
  if (!session) sessionStorage.removeItem(TOKEN_KEY);
  const can = (role) => Boolean(session && session.roles.has(role));

  async function api(method, path, body) {
    if (!session && !path.endsWith("auth/login")) {
      // Signed out while a refresh was under way: its remaining calls would
      // only collect 401s, so they are not sent at all.
      throw new ApiError(401, "SIGNED_OUT", "signed out");
    }
    const headers = { Accept: "application/json" };
    if (session) headers.Authorization = `Bearer ${session.token}`;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    let response;
    try {
      response = await fetch(path.startsWith("/") ? path : `${API}/${path}`, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        cache: "no-store",
        // The token travels in a header; no cookies are needed. Without
        // credentials the browser also never opens its own Basic-auth prompt
        // on a 401 (the coordinator offers Basic in WWW-Authenticate).
        credentials: "omit",
      });
    } catch (err) {
      throw new ApiError(0, "UNREACHABLE", `the coordinator did not answer (${err.message})`);
    }
    let data = null;
    try {
      data = await response.json();
    } catch {
      data = null;
    }
    if (!response.ok) {
      const message = (data && (data.message || data.detail)) || response.statusText;
      const error = new ApiError(response.status, data && data.errorCode, String(message));
      if (response.status === 401 && session && !path.endsWith("auth/login")) {
        signOut("Your session has ended: sign in again.");
      }
      throw error;
    }
    return data;
  }

  function signOut(message) {
    sessionStorage.removeItem(TOKEN_KEY);
    session = null;
    stopPolling();
    render();
    const error = $("signin-error");
    error.hidden = !message;
    error.textContent = message || "";
  }

  $("signin-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const error = $("signin-error");
    const username = $("username").value.trim();
    const password = $("password").value;
    if (!username || !password) {
      error.textContent = "Enter a username and a password.";
      error.hidden = false;
      return;
    }
    const button = event.submitter || $("signin-form").querySelector("button");
    button.disabled = true;
    try {
      const answer = await api("POST", "auth/login", { username, password });
      const next = sessionFrom(answer.accessToken);
      if (!next) throw new ApiError(0, null, "the coordinator answered with an unusable token");
      // The login answer names the roles too; they match the token's claims.
      if (Array.isArray(answer.roles)) next.roles = new Set([...next.roles, ...answer.roles]);
      session = next;
      sessionStorage.setItem(TOKEN_KEY, next.token);
      $("password").value = "";
      error.hidden = true;
      render();
    } catch (err) {
      error.textContent = err.status === 401
        ? `Sign-in refused: ${err.message}` : `Sign-in failed: ${err}`;
      error.hidden = false;
      $("password").focus();
    } finally {
      button.disabled = false;
    }
  });

  $("signout").addEventListener("click", () => signOut(""));

  // -- routing and polling -----------------------------------------------------------------

  let timer = null;
  let generation = 0; // bumps on every navigation: late answers of an old view are dropped
  let settings = null;

  function route() {
    const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
    if (parts[0] === "group" && parts.length === 3 && parts[1] && parts[2]) {
      return { view: "group", prefix: parts[1], group: parts[2] };
    }
    if (parts[0] === "api" && parts.length === 1) return { view: "api" };
    return { view: "overview" };
  }

  function stopPolling() {
    generation += 1;
    if (timer !== null) clearTimeout(timer);
    timer = null;
  }

  function startPolling(refresh) {
    stopPolling();
    $("poll-error").hidden = true;
    const mine = generation;
    const loop = async () => {
      let delay = POLL_MS;
      try {
        delay = (await refresh(() => mine === generation)) || POLL_MS;
        if (mine === generation) $("poll-error").hidden = true;
      } catch (err) {
        if (mine === generation) reportPollError(err);
      }
      if (mine === generation && session) timer = setTimeout(loop, delay);
    };
    loop();
  }

  function reportPollError(err) {
    if (err && err.status === 0) {
      const badge = $("health");
      badge.className = "health DOWN";
      badge.dataset.status = "UNREACHABLE";
      badge.textContent = "coordinator unreachable";
    }
    if (!session) return; // a 401 signed out already and says so on the form
    $("poll-error").textContent = `Could not refresh: ${err}`;
    $("poll-error").hidden = false;
  }

  function show(id) {
    for (const view of ["signin-view", "overview-view", "api-view", "group-view"]) $(view).hidden = view !== id;
  }

  let currentRoute = null;

  function render() {
    const signedIn = Boolean(session);
    $("signout").hidden = !signedIn;
    $("who").hidden = !signedIn;
    $("health").hidden = !signedIn;
    $("nav").hidden = !signedIn;
    if (!signedIn) {
      stopPolling();
      currentRoute = null;
      show("signin-view");
      $("username").focus();
      return;
    }
    $("who").textContent = `${session.user} (${[...session.roles].sort().join(", ")})`;
    const next = route();
    const key = JSON.stringify(next);
    if (key === currentRoute) return;
    currentRoute = key;
    if (next.view === "group") openGroup(next.prefix, next.group);
    else if (next.view === "api") openApi();
    else openOverview();
    $("main").focus({ preventScroll: true });
  }

  window.addEventListener("hashchange", render);

  async function refreshHealth() {
    const health = await api("GET", "monitoring/health");
    const badge = $("health");
    const status = health.loop === "TERMINATING" ? "TERMINATING" : health.status || "?";
    badge.className = `health ${status}`;
    const reasons = status === "UP" ? "" : ` — redis ${health.redis}, loop ${health.loop}`;
    badge.textContent = `${status}${reasons}`;
    badge.title = `coordinator ${health.coordinatorId}: redis ${health.redis}, loop ${health.loop}`;
    badge.dataset.status = status;
  }

  const groupPath = (prefix, group) =>
    `streams/${encodeURIComponent(prefix)}/groups/${encodeURIComponent(group)}`;

  // -- overview ----------------------------------------------------------------------------

  const rateMemory = new Map(); // "prefix/group" -> {t, produced, consumed}

  function rates(key, offsets) {
    let produced = 0, consumed = 0;
    for (const s of offsets.shards || []) {
      produced += s.streamLength || 0;
      consumed += Math.max(0, (s.streamLength || 0) - (s.lag || 0) - (s.pendingCount || 0));
    }
    const now = performance.now();
    const before = rateMemory.get(key);
    rateMemory.set(key, { t: now, produced, consumed });
    if (!before || now - before.t < 100) return [null, null];
    const dt = (now - before.t) / 1000;
    // Retired shards take their entries with them: never show a negative rate.
    return [Math.max(0, produced - before.produced) / dt, Math.max(0, consumed - before.consumed) / dt];
  }

  // The overview's per-group details (offsets, members): fetched DETAIL_BATCH
  // groups per round, round-robin, so a thousand groups do not mean a burst of
  // two thousand requests (issue 36).
  const DETAIL_BATCH = 25;
  const detailCache = new Map();
  let detailCursor = 0;

  function openOverview() {
    show("overview-view");
    document.title = "streamkit console";
    startPolling(async (current) => {
      const [, list] = await Promise.all([refreshHealth(), api("GET", "monitoring/groups")]);
      const groups = list.groups || [];
      // At most DETAIL_BATCH groups' details per round, the next ones the round
      // after (the others show what was read last): a round costs at most
      // 2 + 2 * DETAIL_BATCH requests however many groups there are.
      const batch = groups.length <= DETAIL_BATCH ? groups
        : Array.from({ length: DETAIL_BATCH }, (_, i) => groups[(detailCursor + i) % groups.length]);
      detailCursor = groups.length ? (detailCursor + batch.length) % groups.length : 0;
      await Promise.all(batch.map(async (g) => {
        const base = `monitoring/${groupPath(g.streamPrefix, g.consumerGroup)}`;
        const [offsets, members] = await Promise.all([
          api("GET", `${base}/offsets`).catch(() => null),
          api("GET", `${base}/members`).catch(() => null),
        ]);
        const key = `${g.streamPrefix}/${g.consumerGroup}`;
        // Rates from fresh offsets only: a cached sample would read as zero.
        detailCache.set(key, { offsets, members, rated: offsets ? rates(key, offsets) : null });
      }));
      const details = groups.map((g) => ({ g, ...(detailCache.get(`${g.streamPrefix}/${g.consumerGroup}`) || { offsets: null, members: null, rated: null }) }));
      if (!current()) return;
      const body = $("groups-table").querySelector("tbody");
      body.replaceChildren(...details.map(({ g, offsets, members, rated }) => {
        const key = `${g.streamPrefix}/${g.consumerGroup}`;
        const assigned = Object.values(g.currentAssignmentSummary || {}).reduce((a, b) => a + b, 0);
        const live = members ? members.members.filter((m) => LIVE_MEMBER_STATES.has(m.state)).length : null;
        const [produced, consumed] = rated || [null, null];
        const m = g.activeMigration;
        return h("tr", { "data-group": key },
          h("td", {}, g.streamPrefix),
          h("td", {}, h("a", { href: `#/group/${encodeURIComponent(g.streamPrefix)}/${encodeURIComponent(g.consumerGroup)}` }, g.consumerGroup)),
          h("td", {}, g.state),
          h("td", { class: "num" }, `${assigned} / ${g.shardCount}`),
          h("td", { class: "num" }, fmt.num(live)),
          h("td", { class: "num" }, fmt.num(offsets && offsets.totalLag)),
          h("td", { class: "num" }, fmt.num(offsets && offsets.totalPendingCount)),
          h("td", { class: "num" }, fmt.rate(produced)),
          h("td", { class: "num" }, fmt.rate(consumed)),
          h("td", { class: "num" }, offsets && offsets.memoryUsageKnown === false
            ? "?" : fmt.bytes(offsets && offsets.totalMemoryUsageBytes)),
          h("td", {}, m ? `${m.state} ${m.fromShardCount}→${m.toShardCount}` : "—"));
      }));
      $("groups-empty").hidden = groups.length > 0;
      // Two reads per group fetched (offsets asks Redis about every shard):
      // with many groups, poll less often rather than load the coordinator.
      return Math.max(POLL_MS, batch.length * 100);
    });
  }

  // -- API performance ---------------------------------------------------------------------

  const apiMemory = new Map(); // "METHOD route" -> {t, count}

  function openApi() {
    show("api-view");
    document.title = "API performance · streamkit console";
    startPolling(async (current) => {
      const [, perf] = await Promise.all([refreshHealth(), api("GET", "monitoring/api-performance")]);
      if (!current()) return;
      $("api-coordinator").textContent = perf.coordinatorId;
      $("api-since").textContent = fmt.time(perf.startedAt);
      const now = performance.now();
      const ms = (v) => (v === null || v === undefined ? "—" : v.toFixed(v < 10 ? 2 : 1));
      $("api-table").querySelector("tbody").replaceChildren(...(perf.routes || []).map((r) => {
        const key = `${r.method} ${r.route}`;
        const before = apiMemory.get(key);
        apiMemory.set(key, { t: now, count: r.count });
        const rate = before && now - before.t >= 100 ? Math.max(0, r.count - before.count) / ((now - before.t) / 1000) : null;
        return h("tr", { "data-route": r.route, "data-method": r.method },
          h("td", {}, r.route),
          h("td", {}, r.method),
          h("td", { class: "num", "data-col": "count" }, fmt.num(r.count)),
          h("td", { class: "num" }, fmt.rate(rate)),
          h("td", { class: "num" }, fmt.num(r.clientErrors)),
          h("td", { class: "num" }, fmt.num(r.serverErrors)),
          h("td", { class: "num" }, ms(r.meanMs)),
          h("td", { class: "num" }, ms(r.p50Ms)),
          h("td", { class: "num" }, ms(r.p99Ms)));
      }));
      return null;
    });
  }

  // -- group -------------------------------------------------------------------------------

  let view = null; // what the group page last loaded

  function openGroup(prefix, group) {
    show("group-view");
    document.title = `${prefix}/${group} · streamkit console`;
    $("group-title").textContent = `${prefix} / ${group}`;
    $("action-error").hidden = true;
    $("scale-note").hidden = true;
    view = { prefix, group, shardOptions: "" };
    messages.reset();
    deadLetters.reset();
    applyRoles();
    startPolling(async (current) => {
      if (!settings) settings = await api("GET", "/console/settings.json");
      const base = `monitoring/${groupPath(prefix, group)}`;
      const [, g, members, assignments, offsets, migrations, letters] = await Promise.all([
        refreshHealth(),
        api("GET", base),
        api("GET", `${base}/members`),
        api("GET", `${base}/assignments`),
        api("GET", `${base}/offsets`),
        api("GET", `${base}/migrations`),
        deadLetters.fetch(),
      ]);
      if (!current()) return;
      Object.assign(view, { g, members: members.members || [], assignments, offsets, migrations });
      renderGroup();
      deadLetters.render(letters);
    });
  }

  function applyRoles() {
    const writer = can("WRITE");
    for (const id of ["scale-button", "rollback-button", "scale-target", "scale-by", "scale-reason"]) {
      $(id).disabled = !writer;
    }
    $("scale-button").title = writer ? "" : "Needs the WRITE role";
    $("rollback-button").title = writer ? "" : "Needs the WRITE role";
    if (!writer) {
      $("scale-note").hidden = false;
      $("scale-note").textContent = "You have read access only: scaling and rollback need the WRITE role.";
    }
    $("dlq-key-field").disabled = !writer;
    $("dlq-note").hidden = writer;
    $("dlq-note").textContent = writer ? "" : "You have read access only: replaying needs the WRITE role.";
  }

  function shardState(index, a) {
    const inList = (map) => Object.entries(map || {}).find(([, list]) => list.some((s) => s.shardIndex === index));
    const revoking = inList(a.revokeProgress);
    const current = inList(a.currentAssignments);
    const target = inList(a.targetAssignment);
    let state = "unowned";
    if (revoking) state = "revoking";
    else if (current && (!target || target[0] === current[0])) state = "assigned";
    else if (current) state = "revoking"; // held, but targeted elsewhere: the revoke is on its way
    else if (target) state = "pending";
    return { state, owner: current ? current[0] : null, target: target ? target[0] : null };
  }

  function renderGroup() {
    const { g, members, assignments, offsets, migrations } = view;
    const active = g.activeMigration;
    const activeRecord = (migrations.migrations || []).find((m) => m.reshardingId === migrations.activeReshardingId);
    const removed = new Set(activeRecord ? activeRecord.removedShards || [] : []);
    const retired = new Set(activeRecord ? activeRecord.retiredShards || [] : []);

    $("group-summary").replaceChildren(
      h("span", {}, "state ", h("b", { id: "group-state" }, g.state)),
      h("span", {}, "shards ", h("b", { id: "group-shard-count" }, g.shardCount)),
      h("span", {}, "group epoch ", h("b", {}, g.groupEpoch)),
      h("span", {}, "assignment epoch ", h("b", {}, g.assignmentEpoch)),
      h("span", {}, "metadata version ", h("b", {}, g.metadataVersion)),
      h("span", {}, "lag ", h("b", {}, fmt.num(offsets.totalLag))),
      h("span", {}, "pending ", h("b", {}, fmt.num(offsets.totalPendingCount))),
      h("span", {}, "migration ", h("b", {}, active ? `${active.state} ${active.fromShardCount}→${active.toShardCount}` : "none")));

    const violations = assignments.invariantViolations || [];
    $("violations").hidden = violations.length === 0;
    $("violations").textContent = violations.length ? `Invariant violations: ${violations.join("; ")}` : "";

    $("shard-grid").replaceChildren(...(offsets.shards || []).map((s) => {
      const index = s.shard.shardIndex;
      const { state, owner, target } = shardState(index, assignments);
      const isRemoved = removed.has(index) && !retired.has(index);
      const label = `shard ${index}: ${state}${owner ? `, owner ${owner}` : ""}${isRemoved ? ", removed (draining)" : ""}`;
      return h("li", {
        class: `shard ${state}${isRemoved ? " draining" : ""}`,
        "data-shard": index, "data-state": state, "data-owner": owner || "",
        "aria-label": label,
      },
      h("div", { class: "head" }, h("span", {}, `#${index}`), h("span", {}, isRemoved ? `${state} · removed` : state)),
      h("div", { class: "owner", title: owner || "" }, owner || "no owner"),
      target && target !== owner ? h("div", { class: "owner muted", title: target }, `→ ${target}`) : null,
      h("dl", {},
        h("dt", {}, "lag"), h("dd", {}, fmt.num(s.lag)),
        h("dt", {}, "pending"), h("dd", {}, fmt.num(s.pendingCount)),
        h("dt", {}, "length"), h("dd", {}, fmt.num(s.streamLength))));
    }));

    const ttl = settings ? settings.memberLeaseTtlMs : null;
    $("members-table").querySelector("tbody").replaceChildren(...members.map((m) => {
      const live = LIVE_MEMBER_STATES.has(m.state);
      const left = live && ttl !== null ? Math.max(0, ttl - (m.heartbeatAgeMs || 0)) : null;
      const waiting = [...(m.revoking || []).map((s) => `−${s.shardIndex}`), ...(m.pendingShards || []).map((s) => `+${s.shardIndex}`)];
      return h("tr", { "data-member": m.memberId },
        h("td", {}, m.memberId, m.memberName && m.memberName !== m.memberId ? h("span", { class: "muted" }, ` (${m.memberName})`) : null),
        h("td", {}, m.state),
        h("td", { class: "num" }, m.memberEpoch),
        h("td", { class: "num" }, fmt.ms(m.heartbeatAgeMs)),
        h("td", { class: "num" }, fmt.ms(left)),
        h("td", { class: "num" }, (m.currentAssignment || []).length),
        h("td", { class: "wrap" }, fmt.shards(m.currentAssignment)),
        h("td", { class: "wrap" }, waiting.length ? waiting.join(" ") : "—"));
    }));

    renderResharding(activeRecord);
    renderShardOptions();
  }

  function steps(state) {
    const path = ROLLBACK_STEPS.includes(state) ? ["PREPARING", "ACTIVE", ...ROLLBACK_STEPS] : FORWARD_STEPS;
    const at = path.indexOf(state);
    return h("ol", { class: "steps", "aria-label": "Migration states" }, path.map((step, i) => h("li", {
      class: i < at ? "done" : i === at ? "current" : "",
      "aria-current": i === at ? "step" : null,
    }, step)));
  }

  function renderResharding(activeRecord) {
    const { offsets, migrations } = view;
    const all = migrations.migrations || [];
    const shown = activeRecord || all[all.length - 1];
    const box = $("migration-active");
    if (!shown) {
      box.replaceChildren(h("p", { class: "muted" }, "No migration yet."));
    } else {
      const byShard = new Map((offsets.shards || []).map((s) => [s.shard.shardIndex, s]));
      const retired = new Set(shown.retiredShards || []);
      const removed = shown.removedShards || [];
      let leaseNote = null;
      if (activeRecord && shown.switchedAt && settings) {
        const proofAt = Date.parse(shown.switchedAt) + settings.producerRoutingLeaseMs;
        const wait = proofAt - Date.now();
        leaseNote = h("p", { class: "muted" }, wait > 0
          ? `Producer routing lease ends in ${(wait / 1000).toFixed(1)} s; then ${removed.length
            ? "the removed shards are proven drained" : "the migration ends"}.`
          : `Producer routing lease has passed${removed.length
            ? ": the removed shards are being proven drained" : ""}.`);
      }
      box.replaceChildren(h("div", { class: "migration", id: "migration", "data-state": shown.state },
        h("h3", {}, `${activeRecord ? "Active migration" : "Last migration"} ${shown.reshardingId}: `,
          `${shown.fromShardCount} → ${shown.toShardCount} shards, `, h("span", { id: "migration-state" }, shown.state)),
        steps(shown.state),
        h("p", {}, `Added shards: ${fmt.shards(shown.addedShards)}. Removed shards: ${fmt.shards(removed)}. `,
          `Ordering: ${shown.ordering || "none"}. Requested by ${shown.requestedBy || "?"}: ${shown.reason || "—"}.`),
        leaseNote,
        removed.length ? h("div", { class: "scroll" }, h("table", { class: "data", id: "drain-table" },
          h("thead", {}, h("tr", {}, ["Removed shard", "Pending", "Lag", "Retired"].map((c) => h("th", { scope: "col" }, c)))),
          h("tbody", {}, removed.map((index) => {
            const s = byShard.get(index);
            return h("tr", { "data-shard": index },
              h("td", {}, `#${index}`),
              h("td", { class: "num" }, retired.has(index) ? "0" : fmt.num(s && s.pendingCount)),
              h("td", { class: "num" }, retired.has(index) ? "0" : fmt.num(s && s.lag)),
              h("td", {}, retired.has(index) ? "yes" : "draining"));
          }))))
          : h("p", { class: "muted" }, "Nothing to drain: this change removes no shard.")));
    }
    const rollable = activeRecord && ["PREPARING", "ACTIVE", "DRAINING"].includes(activeRecord.state)
      && !(activeRecord.retiredShards || []).length;
    $("rollback-button").hidden = !rollable;
    $("rollback-button").dataset.reshardingId = rollable ? activeRecord.reshardingId : "";
    const target = $("scale-target");
    if (!target.value && document.activeElement !== target) target.value = view.g.shardCount;

    $("history-table").querySelector("tbody").replaceChildren(...[...all].reverse().map((m) => h("tr", { "data-resharding-id": m.reshardingId },
      h("td", {}, m.reshardingId),
      h("td", {}, `${m.fromShardCount} → ${m.toShardCount}`),
      h("td", {}, m.state),
      h("td", {}, m.requestedBy || "—"),
      h("td", { class: "wrap" }, m.reason || "—"),
      h("td", {}, fmt.time(m.createdAt)),
      h("td", {}, fmt.time(m.updatedAt)))));
  }

  // -- actions -------------------------------------------------------------------------------

  /** Ask before a destructive action; resolves true on Confirm. */
  function confirmAction(title, text, okLabel) {
    const dialog = $("confirm");
    $("confirm-title").textContent = title;
    $("confirm-text").textContent = text;
    $("confirm-ok").textContent = okLabel;
    dialog.returnValue = "";
    return new Promise((resolve) => {
      dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
      dialog.showModal();
    });
  }

  function actionError(text) {
    $("action-error").textContent = text;
    $("action-error").hidden = !text;
  }

  function changeFields() {
    const requestedBy = $("scale-by").value.trim();
    const reason = $("scale-reason").value.trim();
    if (!requestedBy || !reason) {
      actionError("Requested by and reason are required.");
      (requestedBy ? $("scale-reason") : $("scale-by")).focus();
      return null;
    }
    return { requestedBy, reason };
  }

  $("scale-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    if (!can("WRITE") || !view) return;
    actionError("");
    const fields = changeFields();
    if (!fields) return;
    const raw = $("scale-target").value.trim();
    const target = Number(raw);
    if (!/^\d+$/.test(raw) || target > 4096) {
      actionError("Target shards must be a whole number from 0 to 4096.");
      $("scale-target").focus();
      return;
    }
    const from = view.g ? view.g.shardCount : "?";
    const ok = await confirmAction("Scale the stream?",
      `Scale stream ${view.prefix} from ${from} to ${target} shards. Every consumer group of the stream moves to the new layout${target < from ? " and removed shards are drained and deleted" : ""}.`,
      `Scale to ${target}`);
    if (!ok) return;
    try {
      const answer = await api("POST", `streams/${encodeURIComponent(view.prefix)}/scale`, { targetShardCount: target, ...fields });
      const id = answer.migrations && answer.migrations[0] ? answer.migrations[0].reshardingId : "";
      $("scale-note").textContent = `Scale to ${target} shards started (${id}).`;
      $("scale-note").hidden = false;
    } catch (err) {
      actionError(`Scale refused: ${err}`);
    }
  });

  $("rollback-button").addEventListener("click", async () => {
    if (!can("WRITE") || !view) return;
    actionError("");
    const id = $("rollback-button").dataset.reshardingId;
    const fields = changeFields();
    if (!id || !fields) return;
    const ok = await confirmAction("Roll back the migration?",
      `Roll back ${id}: routing returns to the previous layout and the added shards are drained and removed.`,
      "Roll back");
    if (!ok) return;
    try {
      await api("POST", `${groupPath(view.prefix, view.group)}/migrations/${encodeURIComponent(id)}/rollback`, fields);
      $("scale-note").textContent = `Rollback of ${id} requested.`;
      $("scale-note").hidden = false;
    } catch (err) {
      actionError(`Rollback refused: ${err}`);
    }
  });

  // -- messages ------------------------------------------------------------------------------

  function renderShardOptions() {
    const shards = (view.offsets.shards || []).map((s) => s.shard.shardIndex);
    const key = shards.join(",");
    if (key === view.shardOptions) return;
    view.shardOptions = key;
    const select = $("msg-shard");
    const keep = select.value;
    select.replaceChildren(...shards.map((i) => h("option", { value: i }, `#${i}`)));
    if (shards.map(String).includes(keep)) select.value = keep;
    else if (shards.length) {
      select.value = String(shards[0]);
      messages.load("last");
    }
  }

  const messages = {
    page: null,
    reset() {
      this.page = null;
      $("msg-shard").replaceChildren();
      $("messages-table").querySelector("tbody").replaceChildren();
      $("msg-where").textContent = "";
      $("msg-error").hidden = true;
      this.buttons();
    },
    buttons() {
      const p = this.page;
      $("msg-first").disabled = !p;
      $("msg-last").disabled = !p;
      $("msg-prev").disabled = !p || !p.hasOlder || !p.records.length;
      $("msg-next").disabled = !p || !p.hasNewer || !p.records.length;
    },
    async load(where) {
      if (!view) return;
      const shard = $("msg-shard").value;
      if (shard === "") return;
      const p = this.page;
      const forward = where === "first" || where === "next";
      const query = new URLSearchParams({ direction: forward ? "FORWARD" : "BACKWARD", limit: "20" });
      if (where === "next") query.set("cursor", p.records[p.records.length - 1].recordId);
      if (where === "prev") query.set("cursor", p.records[0].recordId);
      const mine = generation;
      try {
        const answer = await api("GET", `monitoring/${groupPath(view.prefix, view.group)}/shards/${shard}/messages?${query}`);
        if (mine !== generation) return;
        const records = answer.records || [];
        if (!forward) records.reverse(); // always shown oldest first
        const more = answer.nextCursor !== null && answer.nextCursor !== undefined;
        this.page = {
          records,
          hasOlder: forward ? where === "next" : more,
          hasNewer: forward ? more : where === "prev",
        };
        $("msg-error").hidden = true;
        $("msg-where").textContent = records.length
          ? `${answer.streamKey}: ${records.length} entries, ${records[0].recordId} … ${records[records.length - 1].recordId}`
          : `${answer.streamKey}: no entries here`;
        $("messages-table").querySelector("tbody").replaceChildren(...records.map((r) => h("tr", {},
          h("td", {}, r.recordId),
          h("td", { class: "wrap" }, Object.entries(r.fields || {}).map(([k, v]) => `${k}=${v}`).join("  ").slice(0, 400)))));
      } catch (err) {
        $("msg-error").textContent = `Could not read messages: ${err}`;
        $("msg-error").hidden = false;
      }
      this.buttons();
    },
  };

  for (const where of ["first", "prev", "next", "last"]) {
    $(`msg-${where}`).addEventListener("click", () => messages.load(where));
  }
  $("msg-shard").addEventListener("change", () => messages.load("last"));

  // -- dead letters --------------------------------------------------------------------------

  const deadLetters = {
    after: null, // the page starts after this id (null: the oldest)
    starts: [], // where the previous pages started, for Prev
    shown: "", // what the table shows, so a poll does not rebuild it (and steal focus) for nothing
    last: null,
    reset() {
      this.after = null;
      this.starts = [];
      this.shown = "";
      this.last = null;
      $("dlq-table").querySelector("tbody").replaceChildren();
      $("dlq-where").textContent = "";
      $("dlq-error").hidden = true;
      $("dlq-empty").hidden = true;
      this.buttons();
    },
    path() {
      return `monitoring/${groupPath(view.prefix, view.group)}/dead-letters`;
    },
    fetch() {
      const query = new URLSearchParams({ limit: "20" });
      if (this.after) query.set("cursor", this.after);
      return api("GET", `${this.path()}?${query}`);
    },
    buttons() {
      const page = this.last;
      $("dlq-first").disabled = !page || this.after === null;
      $("dlq-prev").disabled = !page || this.after === null;
      $("dlq-next").disabled = !page || !page.nextCursor;
    },
    async move(where) {
      if (!this.last) return;
      if (where === "first") { this.after = null; this.starts = []; }
      else if (where === "prev") this.after = this.starts.pop() ?? null;
      else if (where === "next" && this.last.nextCursor) { this.starts.push(this.after); this.after = this.last.nextCursor; }
      await this.refresh();
    },
    async refresh() {
      const mine = generation;
      try {
        const page = await this.fetch();
        if (mine === generation) this.render(page);
      } catch (err) {
        if (mine === generation) this.fail(`Could not read dead letters: ${err}`);
      }
    },
    fail(text) {
      $("dlq-error").textContent = text;
      $("dlq-error").hidden = !text;
    },
    render(page) {
      this.last = page;
      const entries = page.entries || [];
      // Everything on this page was replayed: step back rather than show an empty page.
      if (!entries.length && this.after !== null && page.total > 0) {
        this.after = this.starts.pop() ?? null;
        this.refresh();
        return;
      }
      $("dlq-where").textContent = `${page.deadLetterStream}: ${fmt.num(page.total)} dead letter${page.total === 1 ? "" : "s"}`
        + (entries.length ? `, showing ${entries[0].id} … ${entries[entries.length - 1].id}` : "");
      $("dlq-empty").hidden = entries.length > 0;
      this.buttons();
      const writer = can("WRITE");
      const key = JSON.stringify([writer, entries]);
      if (key === this.shown) return;
      this.shown = key;
      $("dlq-table").querySelector("tbody").replaceChildren(...entries.map((e) => h("tr", { "data-id": e.id },
        h("td", {}, e.id),
        h("td", {}, `${e.originalStream}/${e.originalId}`),
        h("td", { class: "text" }, e.error),
        h("td", { class: "num" }, e.attempts),
        h("td", {}, e.failedAt ? fmt.time(new Date(e.failedAt).toISOString()) : "—"),
        h("td", { class: "wrap" }, Object.entries(e.fields || {}).map(([k, v]) => `${k}=${v}`).join("  ").slice(0, 400)),
        h("td", {}, h("button", {
          type: "button", class: "danger replay", "data-id": e.id, "aria-label": `Replay ${e.id}`,
          disabled: !writer, title: writer ? "" : "Needs the WRITE role",
          onclick: () => this.replay(e),
        }, "Replay…")))));
    },
    async replay(entry) {
      if (!can("WRITE") || !view) return;
      this.fail("");
      const keyField = $("dlq-key-field").value.trim();
      const where = keyField
        ? `routed by its field ${keyField} with the current layout`
        : `back to ${entry.originalStream}`;
      const ok = await confirmAction("Replay the dead letter?",
        `Publish ${entry.id} again, ${where}, then delete it from the dead-letter stream. Every consumer group of the stream sees it again.`,
        "Replay");
      if (!ok) return;
      const body = { requestedBy: session.user, reason: "replayed from the console" };
      if (keyField) body.keyField = keyField;
      try {
        const answer = await api("POST",
          `${groupPath(view.prefix, view.group)}/dead-letters/${encodeURIComponent(entry.id)}/replay`, body);
        $("dlq-note").textContent = `Replayed ${answer.id} to ${answer.streamKey}/${answer.recordId}.`;
        $("dlq-note").hidden = false;
      } catch (err) {
        this.fail(`Replay refused: ${err}`);
      }
      await this.refresh();
    },
  };

  for (const where of ["first", "prev", "next"]) {
    $(`dlq-${where}`).addEventListener("click", () => deadLetters.move(where));
  }

  render();
})();
