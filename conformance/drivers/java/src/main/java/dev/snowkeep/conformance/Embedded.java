package dev.snowkeep.conformance;

import com.google.gson.JsonArray;
import com.google.gson.JsonElement;
import com.google.gson.JsonNull;
import com.google.gson.JsonObject;
import dev.snowkeep.client.EmbeddedGenerator;
import dev.snowkeep.client.EmbeddedGeneratorBuilder;
import dev.snowkeep.client.GeneratorStoppedException;
import dev.snowkeep.client.GrantRejectedException;
import dev.snowkeep.client.IdLayout;
import dev.snowkeep.client.Requester;
import dev.snowkeep.client.SnowkeepException;
import dev.snowkeep.client.StopReason;
import dev.snowkeep.client.Worker;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;

/**
 * The embedded generator's ops (issue 26, the Lease API scenarios): the Rust driver's ({@code
 * conformance/src/bin/driver.rs}: {@code embedded_start} with {@code clock_offset_ms}, {@code
 * embedded_take}, {@code embedded_take_until_stop}, {@code embedded_stopped}, {@code
 * embedded_shutdown}) and the Go driver's additions ({@code conformance/drivers/go/embedded.go}:
 * {@code embedded_take} with a {@code spread} of {@code round_robin}, {@code key}, {@code
 * by_thread}, {@code pinned} or {@code batch}, {@code embedded_run}, {@code embedded_status}).
 * Without a {@code spread}, {@code embedded_take} is one {@code nextIds(count)} call, as in Rust.
 * An error answer carries {@code code} and {@code message}, plus, for a refused grant, {@code
 * reason} (Rust's names: {@code invalid_layout}, {@code lease_expired}, ...) and {@code kind}
 * (Go's: {@code bad_layout}, {@code grant_expired}, ...); once the generator stopped, {@code
 * reason} and {@code stop_reason} (its stop reason); and {@code ids} taken before the error where
 * the op takes ids.
 */
final class Embedded {
  private EmbeddedGenerator gen;
  /** One worker per held machine id, pinned by the driver's one thread for one take. */
  private List<Worker> workers;

  JsonObject handle(String op, JsonObject req) {
    if (op.equals("embedded_start")) {
      return start(req);
    }
    if (gen == null) {
      return Driver.error("FAILED_PRECONDITION", "no embedded generator (embedded_start first)");
    }
    switch (op) {
      case "embedded_take": return take(req);
      case "embedded_take_until_stop": return takeUntilStop(req);
      case "embedded_stopped": return stopped(req);
      case "embedded_run": return run(req);
      case "embedded_status": {
        JsonObject o = Driver.ok();
        o.addProperty("ready", gen.isReady());
        o.add("stop_reason", stopName(gen.stopReason()));
        o.add("machine_ids", machineIds());
        return o;
      }
      case "embedded_shutdown": {
        int released = shutdown();
        JsonObject o = Driver.ok();
        o.addProperty("released", released);
        return o;
      }
      default: return Driver.error("UNIMPLEMENTED", "unknown op " + op);
    }
  }

  /** Shuts the generator down (close, or a new embedded_start); returns the released count. */
  int shutdown() {
    if (gen == null) {
      return 0;
    }
    unpin();
    int released = gen.shutdown();
    gen = null;
    workers = null;
    return released;
  }

  private JsonObject start(JsonObject req) {
    shutdown();
    EmbeddedGeneratorBuilder b = EmbeddedGenerator.builder()
        .endpoint(Driver.str(req, "endpoint"))
        .namespace(Driver.str(req, "namespace"))
        .machineIds(Driver.num(req, "machine_ids", 1))
        .apiKey(Driver.str(req, "api_key"))
        .acquireAttempts(Driver.num(req, "acquire_attempts", 1))
        .sendClientTime(!(req.has("omit_client_time") && req.get("omit_client_time").getAsBoolean()));
    if (req.has("tls") && req.get("tls").isJsonObject()) {
      JsonObject tls = req.getAsJsonObject("tls");
      b.tls(path(Driver.str(tls, "ca")), path(Driver.str(tls, "cert")), path(Driver.str(tls, "key")));
    }
    ms(req, "request_timeout_ms").ifPresent(b::requestTimeout);
    ms(req, "check_interval_ms").ifPresent(b::checkInterval);
    ms(req, "max_floor_wait_ms").ifPresent(b::maxFloorWait);
    java.util.Optional<Duration> first = ms(req, "acquire_backoff_ms");
    java.util.Optional<Duration> max = ms(req, "acquire_max_backoff_ms");
    if (first.isPresent() || max.isPresent()) {
      Duration f = first.orElse(Duration.ofSeconds(3));
      b.acquireBackoff(f, max.orElse(f.compareTo(Duration.ofSeconds(60)) > 0 ? f : Duration.ofSeconds(60)));
    }
    long offset = Driver.num(req, "clock_offset_ms", 0L);
    if (offset != 0) {
      b.wallClock(java.time.Clock.offset(java.time.Clock.systemUTC(), Duration.ofMillis(offset)));
    }
    if (req.has("requester") && req.get("requester").isJsonObject()) {
      JsonObject q = req.getAsJsonObject("requester");
      b.requester(new Requester(Driver.str(q, "host_id"), Driver.num(q, "pid", 0L),
          Driver.num(q, "start_unix_ms", 0L), Driver.str(q, "nonce")));
    }
    long began = System.nanoTime();
    try {
      gen = b.start();
    } catch (SnowkeepException e) {
      return error(e, null);
    }
    JsonObject o = Driver.ok();
    o.add("machine_ids", machineIds());
    IdLayout l = gen.layout();
    JsonObject layout = new JsonObject();
    layout.addProperty("timestamp_bits", l.timestampBits());
    layout.addProperty("machine_bits", l.machineBits());
    layout.addProperty("sequence_bits", l.sequenceBits());
    layout.addProperty("epoch_unix_ms", l.epochUnixMs());
    layout.addProperty("time_unit_ms", l.unitMs());
    o.add("layout", layout);
    Requester r = gen.requester();
    JsonObject q = new JsonObject();
    q.addProperty("host_id", r.hostId());
    q.addProperty("pid", r.pid());
    q.addProperty("start_unix_ms", r.startUnixMs());
    q.addProperty("nonce", r.nonce());
    o.add("requester", q);
    o.addProperty("start_ms", (System.nanoTime() - began) / 1_000_000);
    return o;
  }

  private JsonObject take(JsonObject req) {
    int n = Driver.num(req, "count", 1);
    String spread = Driver.str(req, "spread");
    spread = spread == null ? "batch" : spread;
    List<Long> ids = new ArrayList<>(Math.max(n, 0));
    try {
      if (spread.equals("batch")) {
        for (long id : gen.nextIds(n)) {
          ids.add(id);
        }
        return Driver.ids(ids);
      }
      if (spread.equals("pinned")) {
        workers = new ArrayList<>();
        for (int i = 0; i < gen.machineIds().length; i++) {
          workers.add(gen.pin());
        }
      }
      long key = Driver.num(req, "key", 0L);
      for (int i = 0; i < n; i++) {
        switch (spread) {
          case "key": ids.add(gen.nextIdFor(key)); break;
          case "by_thread": ids.add(gen.nextIdFor(Thread.currentThread().getId())); break;
          case "pinned": ids.add(workers.get(i % workers.size()).nextId()); break;
          default: ids.add(gen.nextId()); break;
        }
      }
    } catch (SnowkeepException e) {
      return takeError(e, ids);
    } finally {
      unpin();
    }
    return Driver.ids(ids);
  }

  /** Gives pinned machine ids back, so that the other spreads can use them again. */
  private void unpin() {
    if (workers != null) {
      workers.forEach(Worker::close);
      workers = null;
    }
  }

  /**
   * One id at a time, {@code pace_ms} apart (default 1), until a take fails (its error answer,
   * with every id taken) or {@code max_ms} passed (default 10,000; then DEADLINE_EXCEEDED).
   */
  private JsonObject takeUntilStop(JsonObject req) {
    long pace = Driver.num(req, "pace_ms", 1L);
    long until = System.nanoTime() + Driver.num(req, "max_ms", 10_000L) * 1_000_000;
    List<Long> ids = new ArrayList<>();
    while (System.nanoTime() - until < 0) {
      try {
        ids.add(gen.nextId());
      } catch (SnowkeepException e) {
        return takeError(e, ids);
      }
      sleep(pace);
    }
    return Driver.withIds(Driver.error("DEADLINE_EXCEEDED", "the generator did not stop within max_ms"), ids);
  }

  /** Waits at most {@code wait_ms} for the generator to stop: its reason, or null. */
  private JsonObject stopped(JsonObject req) {
    long until = System.nanoTime() + Driver.num(req, "wait_ms", 0L) * 1_000_000;
    while (gen.stopReason() == null && System.nanoTime() - until < 0) {
      sleep(10);
    }
    JsonObject o = Driver.ok();
    o.add("reason", stopName(gen.stopReason()));
    return o;
  }

  /**
   * The error answer of a take, with the reason the generator stopped: a take can fail a moment
   * before the stop is recorded (the deadline ends issuance and the stop at once), so this waits
   * up to 1 s for it, as the Rust driver does; null when it did not stop.
   */
  private JsonObject takeError(SnowkeepException e, List<Long> ids) {
    long until = System.nanoTime() + 1_000_000_000L;
    while (gen.stopReason() == null && !(e instanceof GeneratorStoppedException)
        && System.nanoTime() - until < 0) {
      sleep(10);
    }
    JsonObject o = error(e, ids);
    o.add("reason", stopName(gen.stopReason()));
    o.add("stop_reason", stopName(gen.stopReason()));
    return o;
  }

  private JsonObject run(JsonObject req) {
    int batch = Driver.num(req, "batch", 100);
    long paceMs = Driver.num(req, "pace_ms", 0L);
    long began = System.nanoTime();
    long end = began + Driver.num(req, "ms", 0L) * 1_000_000;
    List<Long> ids = new ArrayList<>();
    JsonElement stoppedAfter = JsonNull.INSTANCE;
    int afterStop = 0;
    int failed = 0;
    for (;;) {
      if (gen.stopped().isDone()) {
        // Stopped before this call began: it must issue nothing.
        stoppedAfter = new com.google.gson.JsonPrimitive((System.nanoTime() - began) / 1_000_000);
        try {
          long[] got = gen.nextIds(batch);
          afterStop = got.length;
          for (long id : got) {
            ids.add(id);
          }
        } catch (SnowkeepException e) {
          failed++;
        }
        break;
      }
      if (System.nanoTime() - end >= 0) {
        break;
      }
      try {
        for (long id : gen.nextIds(batch)) {
          ids.add(id);
        }
      } catch (SnowkeepException e) {
        failed++;
      }
      sleep(paceMs);
    }
    JsonObject o = Driver.ids(ids);
    o.add("stop_reason", stopName(gen.stopReason()));
    o.add("stopped_after_ms", stoppedAfter);
    o.addProperty("ids_after_stop", afterStop);
    o.addProperty("errors", failed);
    return o;
  }

  private static void sleep(long ms) {
    if (ms <= 0) {
      return;
    }
    try {
      Thread.sleep(ms);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }

  private JsonArray machineIds() {
    JsonArray a = new JsonArray();
    for (int m : gen.machineIds()) {
      a.add(m);
    }
    return a;
  }

  /** The error answer of an embedded generator's error, with kind, stop_reason and ids. */
  static JsonObject error(SnowkeepException e, List<Long> ids) {
    JsonObject o = Driver.error(e.code().name(), e.description());
    if (e instanceof GrantRejectedException) {
      GrantRejectedException.Kind k = ((GrantRejectedException) e).kind();
      o.addProperty("kind", k == GrantRejectedException.Kind.INVALID_LAYOUT ? "bad_layout" : lower(k.name()));
      o.addProperty("reason", k == GrantRejectedException.Kind.GRANT_EXPIRED ? "lease_expired" : lower(k.name()));
    } else if (!(e instanceof GeneratorStoppedException)) {
      o.add("reason", JsonNull.INSTANCE);
    }
    if (e instanceof GeneratorStoppedException) {
      o.add("stop_reason", stopName(((GeneratorStoppedException) e).reason()));
      o.add("reason", stopName(((GeneratorStoppedException) e).reason()));
    }
    return ids == null ? o : Driver.withIds(o, ids);
  }

  static JsonElement stopName(StopReason r) {
    return r == null ? JsonNull.INSTANCE : new com.google.gson.JsonPrimitive(lower(r.name()));
  }

  private static String lower(String s) {
    return s.toLowerCase(Locale.ROOT);
  }

  private static java.util.Optional<Duration> ms(JsonObject o, String name) {
    JsonElement e = o.get(name);
    return e == null || e.isJsonNull()
        ? java.util.Optional.empty() : java.util.Optional.of(Duration.ofMillis(e.getAsLong()));
  }

  private static Path path(String p) {
    return p == null ? null : Path.of(p);
  }
}
