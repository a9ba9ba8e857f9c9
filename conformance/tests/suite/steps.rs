//! A scenario's steps: requests sent to the driver (placeholders filled in),
//! faults done to the cluster before or during them, and the checks on each
//! answer.

use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::Instant;

use super::checker;
use super::cluster::{wait_ready, Cluster};
use super::driver::Driver;

/// What a scenario has seen so far.
pub struct State {
    /// Each server's machine id (plaintext clusters without auth), to find
    /// the server a stream is reading from.
    machine_ids: Vec<Option<u16>>,
    /// The last id of the last answer with ids.
    last_id: Option<u64>,
    /// When the last `wait` step began, in Unix milliseconds.
    waited_from_unix_ms: Option<u64>,
    /// The machine ids the embedded generator holds (its last start).
    embedded_machine_ids: Vec<u16>,
    /// When the runner saw the last `embedded_start`'s first Renew counted
    /// at the server (its `calls` of `LeaseService/Renew`), in Unix
    /// milliseconds: an upper bound on when the generator sent it, which
    /// its lease's deadline counts from.
    embedded_renewed_unix_ms: Option<u64>,
}

impl State {
    pub async fn new(cluster: &Cluster) -> Self {
        let mut machine_ids = Vec::new();
        for s in &cluster.servers {
            let open = cluster.tls.is_none() && cluster.keys.is_none();
            machine_ids.push(if open {
                u16::try_from(s.machine_id().await).ok()
            } else {
                None
            });
        }
        Self {
            machine_ids,
            last_id: None,
            waited_from_unix_ms: None,
            embedded_machine_ids: Vec::new(),
            embedded_renewed_unix_ms: None,
        }
    }
}

/// `value` with the scenario's placeholders replaced.
fn fill(value: &Value, cluster: &Cluster, state: &State) -> Value {
    match value {
        Value::String(s) if s.starts_with('$') => placeholder(s, cluster, state),
        Value::Array(a) => Value::Array(a.iter().map(|v| fill(v, cluster, state)).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, v)| (k.clone(), fill(v, cluster, state)))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn placeholder(name: &str, cluster: &Cluster, state: &State) -> Value {
    let keys = || cluster.keys.as_ref().expect("an auth cluster");
    match name {
        "$endpoints" => cluster.endpoints(),
        // The embedded generator talks to one server's Lease API.
        "$endpoint" => cluster.endpoints()[0].clone(),
        "$lease_key" => json!(keys().lease),
        "$endpoints_with_dead_first" => {
            let mut all = vec![json!(format!(
                "http://127.0.0.1:{}",
                snowkeep_test_support::free_port()
            ))];
            all.extend(cluster.endpoints().as_array().unwrap().iter().cloned());
            Value::Array(all)
        }
        // A plaintext cluster's addresses under https://: a client must
        // speak TLS to them (and fail), never fall back to plaintext.
        "$endpoints_as_https" => {
            let all = cluster.endpoints();
            let https = all
                .as_array()
                .unwrap()
                .iter()
                .map(|e| json!(e.as_str().unwrap().replacen("http://", "https://", 1)));
            Value::Array(https.collect())
        }
        "$key" => json!(keys().ids),
        "$wrong_key" => json!(keys().wrong),
        "$other_namespace_key" => json!(keys().other_namespace),
        "$tls" => cluster.tls_settings(false),
        "$mtls" => cluster.tls_settings(true),
        "$missing_file" => json!("/nonexistent/snowkeep-conformance/ca.pem"),
        "$last_id" => json!(state.last_id.expect("an id taken before").to_string()),
        other => panic!("unknown placeholder {other}"),
    }
}

/// The servers an action names: an index, `all`, or `streaming` (the one
/// whose machine id stamped `last_id`).
fn targets(action: &Value, cluster: &Cluster, state: &State, last_id: Option<u64>) -> Vec<usize> {
    match &action["server"] {
        Value::Number(n) => vec![n.as_u64().unwrap() as usize],
        Value::String(s) if s == "all" => (0..cluster.servers.len()).collect(),
        Value::String(s) if s == "streaming" => {
            let id = last_id.expect("a progress line before the action");
            let m = cluster.layout.decode(id).unwrap().machine_id.0;
            let i = state.machine_ids.iter().position(|&x| x == Some(m));
            vec![i.unwrap_or_else(|| panic!("no server holds machine id {m}"))]
        }
        other => panic!("unknown server {other}"),
    }
}

/// Does `action` (`kill` with `signal` KILL or TERM, `restart` with
/// optional `wait_ready`, `signal` STOP or CONT without waiting) to its
/// servers, `wait`s `ms`, `evict`s the embedded generator's machine ids, or
/// takes etcd through the runbook's `snapshot_save` and `restore`.
async fn act(action: &Value, cluster: &mut Cluster, state: &State, last_id: Option<u64>) {
    if action["do"] == "wait" {
        // The condition is time itself (an age limit passing).
        let ms = action["ms"].as_u64().unwrap();
        tokio::time::sleep(Duration::from_millis(ms)).await;
        return;
    }
    match action["do"].as_str() {
        Some("snapshot_save") => return cluster.snapshot_save(),
        Some("restore") => return cluster.restore().await,
        _ => {}
    }
    if action["do"] == "evict" {
        assert!(
            !state.embedded_machine_ids.is_empty(),
            "evict needs an embedded generator holding machine ids"
        );
        cluster.evict(&state.embedded_machine_ids).await;
        return;
    }
    let servers = targets(action, cluster, state, last_id);
    match action["do"].as_str().unwrap() {
        "kill" => {
            let signal = action["signal"].as_str().unwrap_or("KILL");
            for &i in &servers {
                cluster.servers[i].signal(signal);
            }
            for &i in &servers {
                let s = &mut cluster.servers[i];
                s.wait_exit(Duration::from_secs(30)).await;
            }
        }
        "signal" => {
            let signal = action["signal"].as_str().expect("a signal to send");
            for &i in &servers {
                cluster.servers[i].signal(signal);
            }
        }
        "restart" => {
            for &i in &servers {
                cluster.servers[i].restart();
            }
            if action["wait_ready"].as_bool().unwrap_or(false) {
                for &i in &servers {
                    wait_ready(&cluster.servers[i]).await;
                }
            }
        }
        other => panic!("unknown action {other}"),
    }
}

/// The gRPC method whose calls a request makes.
fn method_of(request: &Value) -> &'static str {
    match request["op"].as_str().unwrap_or("") {
        "stream" | "bench_stream" => "StreamIds",
        "decode" => "GetInfo",
        _ => "NextIds",
    }
}

fn ids_of(answer: &Value) -> Result<Vec<u64>, String> {
    match &answer["ids"] {
        Value::Null => Ok(Vec::new()),
        Value::Array(a) => a
            .iter()
            .map(|v| {
                v.as_str()
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| format!("an id that is not a decimal string: {v}"))
            })
            .collect(),
        other => Err(format!("ids is not an array: {other:.200}")),
    }
}

/// Removes the actions of `pending` that `due` says are due, in order.
fn take_due<'a>(pending: &mut Vec<&'a Value>, due: impl Fn(&Value) -> bool) -> Vec<&'a Value> {
    let (now, later): (Vec<&Value>, Vec<&Value>) = pending.iter().partition(|a| due(a));
    *pending = later;
    now
}

/// Sends `request`, doing the step's `during` actions at their progress
/// (`at_received`) or time (`after_ms`); the answer.
async fn exchange(
    request: &Value,
    during: &[Value],
    cluster: &mut Cluster,
    driver: &mut Driver,
    state: &State,
) -> Result<Value, String> {
    driver.send(request).await?;
    let sent = Instant::now();
    let mut pending: Vec<&Value> = during.iter().collect();
    let mut last_progress_id = None;
    loop {
        let timed = pending
            .iter()
            .filter_map(|a| a["after_ms"].as_u64())
            .min()
            .map(|ms| sent + Duration::from_millis(ms));
        let line = match timed {
            Some(at) => tokio::select! {
                line = driver.line() => Some(line?),
                () = tokio::time::sleep_until(at) => None,
            },
            None => Some(driver.line().await?),
        };
        let Some(line) = line else {
            let now = Instant::now();
            let due = take_due(&mut pending, |a| {
                a["after_ms"]
                    .as_u64()
                    .is_some_and(|ms| sent + Duration::from_millis(ms) <= now)
            });
            for a in due {
                act(a, cluster, state, last_progress_id).await;
            }
            continue;
        };
        if line.get("ok").is_some() {
            return Ok(line);
        }
        let progress = &line["progress"];
        let received = progress["received"]
            .as_u64()
            .ok_or_else(|| format!("neither an answer nor progress: {line:.300}"))?;
        last_progress_id = progress["last_id"].as_str().and_then(|s| s.parse().ok());
        let due = take_due(&mut pending, |a| {
            a["at_received"].as_u64().is_some_and(|n| received >= n)
        });
        for a in due {
            act(a, cluster, state, last_progress_id).await;
        }
    }
}

/// Checks `answer` (to `request`) against `expect`; records its ids.
fn check(
    request: &Value,
    answer: &Value,
    expect: &Value,
    cluster: &Cluster,
    state: &mut State,
) -> Result<(), String> {
    let ids = ids_of(answer)?;
    checker::record(&ids)?;
    match request["op"].as_str().unwrap_or("") {
        "next_ids" | "embedded_take" => checker::ascending(&ids)?,
        "embedded_take_until_stop" => {
            checker::ascending_per_machine_id(&cluster.layout, &ids)?;
        }
        "stream" => {
            let machine_ids = checker::ascending_per_machine_id(&cluster.layout, &ids)?;
            if expect["resumed"].as_bool() == Some(true) && machine_ids.len() < 2 {
                return Err(format!(
                    "the stream was not resumed on another server: machine ids {machine_ids:?}"
                ));
            }
        }
        _ => {}
    }
    let ok = answer["ok"].as_bool() == Some(true);
    let want_ok = expect["ok"].as_bool().unwrap_or(true);
    if ok != want_ok {
        return Err(format!("expected ok={want_ok}, got {answer:.600}"));
    }
    if let Some(n) = expect["ids"].as_u64() {
        if ids.len() as u64 != n {
            return Err(format!("expected {n} ids, got {}", ids.len()));
        }
    }
    if let Some(code) = expect["code"].as_str() {
        if answer["code"] != code {
            return Err(format!("expected code {code}, got {answer:.600}"));
        }
    }
    let message = answer["message"].as_str().unwrap_or("").to_lowercase();
    for word in expect["message_contains"].as_array().into_iter().flatten() {
        let word = word.as_str().unwrap().to_lowercase();
        if !message.contains(&word) {
            return Err(format!("the message does not name {word:?}: {message:?}"));
        }
    }
    if expect["issued_after_wait"].as_bool() == Some(true) {
        issued_after_wait(&ids, cluster, state)?;
    }
    if expect["decoded"].as_bool() == Some(true) {
        check_decoded(request, answer, cluster)?;
    }
    check_embedded(answer, expect, cluster, state, &ids)?;
    if let Some(&last) = ids.last() {
        state.last_id = Some(last);
    }
    Ok(())
}

/// The embedded generator's expectations: `reason` (a stop or fail-fast
/// reason, or null), `machine_ids` (how many are held), `released`, and
/// `stamped_within_ms` (no id stamped later than that after the first
/// Renew was seen at the server: the lease's end by the generator's clock
/// is at most that).
fn check_embedded(
    answer: &Value,
    expect: &Value,
    cluster: &Cluster,
    state: &mut State,
    ids: &[u64],
) -> Result<(), String> {
    if let Some(reason) = expect.get("reason") {
        if &answer["reason"] != reason {
            return Err(format!("expected reason {reason}, got {answer:.600}"));
        }
    }
    if let Some(held) = answer["machine_ids"].as_array() {
        state.embedded_machine_ids = held
            .iter()
            .map(|m| m.as_u64().and_then(|m| u16::try_from(m).ok()))
            .collect::<Option<_>>()
            .ok_or(format!("machine ids that are not numbers: {answer:.300}"))?;
    }
    if let Some(n) = expect["machine_ids"].as_u64() {
        if state.embedded_machine_ids.len() as u64 != n {
            return Err(format!("expected {n} machine ids held, got {answer:.300}"));
        }
    }
    if let Some(n) = expect.get("released") {
        if &answer["released"] != n {
            return Err(format!(
                "expected {n} machine ids released, got {answer:.300}"
            ));
        }
    }
    if let Some(within) = expect["stamped_within_ms"].as_u64() {
        let started = state.embedded_renewed_unix_ms.ok_or(
            "stamped_within_ms needs an embedded_start step that counts its LeaseService/Renew",
        )?;
        for &id in ids {
            let at = stamped_unix_ms(cluster, id)?;
            if at > started + within {
                return Err(format!("id {id} was stamped at {at} ms, {} ms after its first renewal reached the server: past the lease's end", at - started));
            }
        }
    }
    Ok(())
}

/// When `id` was stamped, in Unix milliseconds (its tick's start).
fn stamped_unix_ms(cluster: &Cluster, id: u64) -> Result<u64, String> {
    let d = cluster
        .layout
        .decode(id)
        .ok_or(format!("id {id} does not decode"))?;
    Ok(cluster.layout.to_unix_ms(d.timestamp))
}

/// Every id's timestamp is at or after the last `wait` began: none was
/// fetched before it (a pool handing out ids past their max age would).
fn issued_after_wait(ids: &[u64], cluster: &Cluster, state: &State) -> Result<(), String> {
    let from = state
        .waited_from_unix_ms
        .ok_or("issued_after_wait needs a wait step before it")?;
    for &id in ids {
        let at = stamped_unix_ms(cluster, id)?;
        if at < from {
            return Err(format!("id {id} was issued at {at} ms, before the wait began at {from} ms: an id past its max age handed out"));
        }
    }
    Ok(())
}

/// The driver's decode of `request.id` equals the runner's own.
fn check_decoded(request: &Value, answer: &Value, cluster: &Cluster) -> Result<(), String> {
    let id: u64 = request["id"].as_str().unwrap().parse().unwrap();
    let d = cluster.layout.decode(id).unwrap();
    let want = json!({
        "unix_ms": cluster.layout.to_unix_ms(d.timestamp),
        "machine_id": d.machine_id.0,
        "sequence": d.sequence,
    });
    let got = json!({
        "unix_ms": answer["unix_ms"],
        "machine_id": answer["machine_id"],
        "sequence": answer["sequence"],
    });
    if got != want {
        return Err(format!("decode of {id}: expected {want}, got {got}"));
    }
    Ok(())
}

/// Runs one step: an action (`do`; `restart_driver` kills the driver and
/// starts a new one), or a request (`send`, with `during`
/// actions and `expect`ed answer, and `server_calls`: the exact number of
/// calls of its method that reached the servers).
pub async fn run(
    step: &Value,
    cluster: &mut Cluster,
    driver: &mut Driver,
    state: &mut State,
) -> Result<(), String> {
    if step.get("do").is_some() {
        if step["do"] == "restart_driver" {
            // The generator it ran is gone with it.
            state.embedded_machine_ids.clear();
            return driver.restart().await;
        }
        if step["do"] == "wait" {
            state.waited_from_unix_ms = Some(unix_ms_now());
        }
        act(step, cluster, state, state.last_id).await;
        return Ok(());
    }
    let request = fill(&step["send"], cluster, state);
    let expect = &step["expect"];
    let method = method_of(&request);
    let calls_before = cluster.calls(method).await;
    let counted = counted_calls(cluster, expect).await;
    let during = step["during"].as_array().cloned().unwrap_or_default();
    let answer = exchange(&request, &during, cluster, driver, state).await?;
    check(&request, &answer, expect, cluster, state)?;
    if let Some(n) = expect["server_calls"].as_u64() {
        server_calls(cluster, method, calls_before, n).await?;
    }
    for (method, before) in counted {
        let n = expect["calls"][&method].as_u64().unwrap();
        server_calls(cluster, &method, before, n).await?;
        if request["op"] == "embedded_start" && method == "LeaseService/Renew" {
            state.embedded_renewed_unix_ms = Some(unix_ms_now());
        }
    }
    Ok(())
}

/// The counts before a step of each method its `expect.calls` names
/// (`{"LeaseService/Acquire": 1}`: exactly one such call reached the
/// servers during the step).
async fn counted_calls(cluster: &Cluster, expect: &Value) -> Vec<(String, u64)> {
    let mut counted = Vec::new();
    for method in expect["calls"]
        .as_object()
        .into_iter()
        .flat_map(|o| o.keys())
    {
        counted.push((method.clone(), cluster.calls(method).await));
    }
    counted
}

/// Waits (at most 3 s: a server counts a stream when its last message is
/// sent, which can be just after the client has read it) until the calls of
/// `method` that reached the servers since `before` number `n`; an error
/// when they pass `n` or never reach it.
async fn server_calls(cluster: &Cluster, method: &str, before: u64, n: u64) -> Result<(), String> {
    let until = Instant::now() + Duration::from_secs(3);
    loop {
        let calls = cluster.calls(method).await.saturating_sub(before);
        if calls > n || (calls < n && Instant::now() >= until) {
            return Err(format!(
                "expected {n} {method} calls to reach the servers, counted {calls}"
            ));
        }
        if calls == n {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The wall clock in Unix milliseconds (the servers' clock: same host).
fn unix_ms_now() -> u64 {
    use snowkeep_client::Clock as _;
    snowkeep_client::SystemClock.unix_ms()
}
