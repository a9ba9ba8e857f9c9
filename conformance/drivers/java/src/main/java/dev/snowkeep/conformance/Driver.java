package dev.snowkeep.conformance;

import com.google.gson.JsonArray;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import dev.snowkeep.client.DecodedId;
import dev.snowkeep.client.IdPool;
import dev.snowkeep.client.IdStream;
import dev.snowkeep.client.SnowkeepClient;
import dev.snowkeep.client.SnowkeepClientBuilder;
import dev.snowkeep.client.SnowkeepException;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.CancellationException;

/**
 * The conformance driver of the Java client: one JSON request per line on stdin, JSON lines on
 * stdout (conformance/README.md). Uses the client's public API only.
 */
public final class Driver {
  private final PrintStream out;
  private SnowkeepClient client;
  private IdPool pool;
  private final Embedded embedded = new Embedded();

  private Driver(PrintStream out) {
    this.out = out;
  }

  /**
   * Reads requests until the end of stdin.
   *
   * @param args unused
   * @throws Exception when stdin cannot be read
   */
  public static void main(String[] args) throws Exception {
    PrintStream out = new PrintStream(new java.io.FileOutputStream(java.io.FileDescriptor.out), false, StandardCharsets.UTF_8);
    Driver d = new Driver(out);
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    String line;
    while ((line = in.readLine()) != null) {
      if (!line.isBlank()) {
        d.handle(line);
      }
    }
    d.closeAll();
    out.flush();
    System.exit(0);
  }

  private void handle(String line) {
    JsonObject req;
    try {
      req = JsonParser.parseString(line).getAsJsonObject();
    } catch (RuntimeException e) {
      emit(error("INVALID_ARGUMENT", "not a JSON object: " + e.getMessage()));
      return;
    }
    try {
      emit(dispatch(req));
    } catch (SnowkeepException e) {
      emit(error(e.code().name(), e.description()));
    } catch (CancellationException e) {
      emit(error("CANCELLED", String.valueOf(e.getMessage())));
    } catch (RuntimeException e) {
      e.printStackTrace();
      emit(error("UNKNOWN", e.toString()));
    }
  }

  private JsonObject dispatch(JsonObject req) {
    String op = str(req, "op");
    switch (op == null ? "" : op) {
      case "open": return open(req);
      case "next_ids": return ids(Arrays.stream(client().nextIds(num(req, "count", 1)))
          .boxed().toList());
      case "stream": return Ops.stream(this, req);
      case "pool_open": return poolOpen(req);
      case "pool_take": return poolTake(req);
      case "pool_close": return poolClose();
      case "decode": return decode(req);
      case "bench_stream": return Ops.benchStream(client(), req);
      case "bench_unary": return Ops.benchUnary(client(), req);
      case "bench_pool": return Ops.benchPool(client(), req);
      case "close": closeAll(); return ok();
      case "embedded_start":
      case "embedded_take":
      case "embedded_take_until_stop":
      case "embedded_stopped":
      case "embedded_run":
      case "embedded_status":
      case "embedded_shutdown":
        return embedded.handle(op, req);
      default: return error("INVALID_ARGUMENT", "unknown op " + op);
    }
  }

  private JsonObject open(JsonObject req) {
    closeClient(); // the embedded generator, if any, stays
    SnowkeepClientBuilder b = SnowkeepClient.builder();
    List<String> endpoints = new ArrayList<>();
    if (req.has("endpoints") && req.get("endpoints").isJsonArray()) {
      for (JsonElement e : req.getAsJsonArray("endpoints")) {
        endpoints.add(e.isJsonNull() ? null : e.getAsString());
      }
    }
    b.endpoints(endpoints).apiKey(str(req, "api_key"));
    if (req.has("tls") && req.get("tls").isJsonObject()) {
      JsonObject tls = req.getAsJsonObject("tls");
      b.tls(path(str(tls, "ca")), path(str(tls, "cert")), path(str(tls, "key")));
    }
    duration(req, "request_timeout_ms").ifPresent(b::requestTimeout);
    duration(req, "retry_budget_ms").ifPresent(b::retryBudget);
    duration(req, "backoff_ms").ifPresent(b::backoff);
    duration(req, "max_backoff_ms").ifPresent(b::maxBackoff);
    client = b.build();
    return ok();
  }

  private JsonObject poolOpen(JsonObject req) {
    if (pool != null) {
      pool.close();
      pool = null;
    }
    int batch = num(req, "batch", 100);
    int low = num(req, "low_water", batch / 4);
    long maxAge = (long) num(req, "max_age_ms", 600_000);
    pool = client().pool(batch, low, Duration.ofMillis(maxAge));
    return ok();
  }

  private JsonObject poolTake(JsonObject req) {
    if (pool == null) {
      return error("FAILED_PRECONDITION", "pool closed");
    }
    int count = num(req, "count", 1);
    List<Long> taken = new ArrayList<>(count);
    try {
      for (int i = 0; i < count; i++) {
        taken.add(pool.next());
      }
    } catch (SnowkeepException e) {
      return withIds(error(e.code().name(), e.description()), taken);
    }
    return ids(taken);
  }

  private JsonObject poolClose() {
    if (pool != null) {
      pool.close();
    }
    return ok();
  }

  private JsonObject decode(JsonObject req) {
    long id;
    try {
      id = Long.parseUnsignedLong(str(req, "id"));
    } catch (RuntimeException e) {
      return error("INVALID_ARGUMENT", "id: not an unsigned 64-bit number: " + str(req, "id"));
    }
    DecodedId d = client().decode(id);
    JsonObject o = ok();
    o.addProperty("unix_ms", d.unixMs());
    o.addProperty("machine_id", d.machineId());
    o.addProperty("sequence", d.sequence());
    return o;
  }

  SnowkeepClient client() {
    if (client == null) {
      throw new SnowkeepException(io.grpc.Status.Code.FAILED_PRECONDITION, "client closed");
    }
    return client;
  }

  /** Shuts the embedded generator down and closes the client and pool. */
  private void closeAll() {
    embedded.shutdown();
    closeClient();
  }

  private void closeClient() {
    if (pool != null) {
      pool.close();
      pool = null;
    }
    if (client != null) {
      client.close();
      client = null;
    }
  }

  /** Writes one line and flushes it. */
  void emit(JsonObject o) {
    out.println(o.toString());
    out.flush();
  }

  static JsonObject ok() {
    JsonObject o = new JsonObject();
    o.addProperty("ok", true);
    return o;
  }

  static JsonObject error(String code, String message) {
    JsonObject o = new JsonObject();
    o.addProperty("ok", false);
    o.addProperty("code", code);
    o.addProperty("message", message);
    return o;
  }

  static JsonObject ids(List<Long> ids) {
    return withIds(ok(), ids);
  }

  static JsonObject withIds(JsonObject o, List<Long> ids) {
    JsonArray a = new JsonArray(ids.size());
    for (long id : ids) {
      a.add(Long.toUnsignedString(id));
    }
    o.add("ids", a);
    return o;
  }

  static String str(JsonObject o, String name) {
    JsonElement e = o.get(name);
    return e == null || e.isJsonNull() ? null : e.getAsString();
  }

  static int num(JsonObject o, String name, int dflt) {
    JsonElement e = o.get(name);
    return e == null || e.isJsonNull() ? dflt : (int) Math.max(Integer.MIN_VALUE,
        Math.min(Integer.MAX_VALUE, e.getAsLong()));
  }

  static long num(JsonObject o, String name, long dflt) {
    JsonElement e = o.get(name);
    return e == null || e.isJsonNull() ? dflt : e.getAsLong();
  }

  private static java.util.Optional<Duration> duration(JsonObject o, String name) {
    JsonElement e = o.get(name);
    return e == null || e.isJsonNull()
        ? java.util.Optional.empty() : java.util.Optional.of(Duration.ofMillis(e.getAsLong()));
  }

  private static Path path(String p) {
    return p == null ? null : Path.of(p);
  }

  IdStream newStream(long total, int batchSize) {
    return client().stream(total, batchSize);
  }
}
