package dev.snowkeep.client;

import dev.snowkeep.v1.GetInfoRequest;
import dev.snowkeep.v1.GetInfoResponse;
import dev.snowkeep.v1.IdServiceGrpc;
import dev.snowkeep.v1.InfoServiceGrpc;
import dev.snowkeep.v1.Layout;
import dev.snowkeep.v1.NextIdsRequest;
import dev.snowkeep.v1.NextIdsResponse;
import io.grpc.Status;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.CancellationException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import java.util.concurrent.atomic.AtomicReference;

/**
 * A client of one or more snowkeep servers: ids one batch at a time ({@link #nextIds}), a
 * stream of exactly {@code total} ids that resumes on another server when one goes away
 * ({@link #stream}), a prefetching pool ({@link #pool}) and id decoding ({@link #decode}).
 *
 * <p>Ids are Java {@code long}s. They are at most 63 bits wide, so they are never negative.
 *
 * <p>Calls go to the endpoints round-robin, skipping an endpoint ejected after a retryable
 * failure (for {@code backoff} doubling per consecutive failure up to {@code maxBackoff}). A
 * retryable failure ({@code UNAVAILABLE}, {@code DEADLINE_EXCEEDED}, {@code UNKNOWN},
 * {@code CANCELLED}, {@code RESOURCE_EXHAUSTED}, {@code ABORTED}, {@code INTERNAL},
 * {@code FAILED_PRECONDITION}, {@code NOT_FOUND}, or a transport failure) is retried on the next
 * endpoint at once; after a full round of failures the call sleeps {@code backoff} (doubling to
 * {@code maxBackoff}, ±20 % jitter). Each attempt has a deadline of {@code requestTimeout}, and
 * the whole call is bounded by {@code retryBudget}, after which it fails with the last
 * retryable error. Every other code fails at once with a {@link SnowkeepException}.
 *
 * <p>Build one with {@link #builder()}; it is thread-safe and meant to be shared. Connections
 * open lazily: building a client makes no call. {@link #close()} closes the connections.
 */
public final class SnowkeepClient implements AutoCloseable {
  /** The largest count of {@link #nextIds}. */
  public static final int MAX_COUNT = 100_000;

  private final Core core;
  private final AtomicReference<CompletableFuture<IdLayout>> layout = new AtomicReference<>();

  SnowkeepClient(Core core) {
    this.core = core;
  }

  /**
   * A builder of a client.
   *
   * @return a new builder with the default settings
   */
  public static SnowkeepClientBuilder builder() {
    return new SnowkeepClientBuilder();
  }

  /**
   * {@code count} ids, strictly ascending, from one server, without blocking.
   *
   * <p>Cancelling the returned future cancels the call: the attempt in flight ends at once and
   * no retry follows.
   *
   * @param count how many ids, 1 to 100,000
   * @return a future of the ids (each in [0, 2^63 − 1]); it completes exceptionally with a
   *     {@link SnowkeepException}: the server's non-retryable status, the last retryable one once
   *     the retry budget is spent, or {@code FAILED_PRECONDITION} "client closed"
   * @throws SnowkeepException INVALID_ARGUMENT naming {@code count} when it is outside 1 to
   *     100,000 (before any call)
   */
  public CompletableFuture<long[]> nextIdsAsync(int count) {
    checkCount(count);
    if (core.isClosed()) {
      return CompletableFuture.failedFuture(Core.closedError());
    }
    NextIdsRequest request = NextIdsRequest.newBuilder().setCount(count).build();
    return UnaryCall.start(
        core, IdServiceGrpc.getNextIdsMethod(), request, r -> ids(r, count));
  }

  /**
   * {@code count} ids, strictly ascending, from one server; blocks until they arrive.
   *
   * <p>Interrupting the waiting thread cancels the call and throws {@link
   * CancellationException} (with the thread's interrupt flag set again).
   *
   * @param count how many ids, 1 to 100,000
   * @return the ids, each in [0, 2^63 − 1]
   * @throws SnowkeepException as {@link #nextIdsAsync}
   */
  public long[] nextIds(int count) {
    return await(nextIdsAsync(count));
  }

  /**
   * A stream of exactly {@code total} ids in batches of {@code batchSize}, resuming on another
   * endpoint for the remaining ids when a server ends it early with a retryable code. See
   * {@link IdStream} for the guarantee. The stream opens on the first {@code hasNext()}.
   *
   * @param total how many ids, at least 1
   * @param batchSize ids per batch, 1 to 100,000; 0 means the server's default (1,000)
   * @return the stream; close it to cancel it
   * @throws SnowkeepException INVALID_ARGUMENT naming {@code total} or {@code batch_size}
   */
  public IdStream stream(long total, int batchSize) {
    if (total < 1) {
      throw SnowkeepException.invalid("total", total + " is outside 1 to 2^63 - 1");
    }
    if (batchSize < 0 || batchSize > MAX_COUNT) {
      throw SnowkeepException.invalid("batch_size", batchSize + " is outside 0 to 100000");
    }
    checkOpen();
    return new IdStream(core, total, batchSize);
  }

  /**
   * A prefetching pool with the defaults: batches of 100, refilled at 25 ids or fewer, ids
   * kept at most 10 minutes.
   *
   * @return the pool, already fetching its first batch
   */
  public IdPool pool() {
    return pool(100, 25, Duration.ofMinutes(10));
  }

  /**
   * A prefetching pool over this client (see {@link IdPool}).
   *
   * @param batch ids fetched per refill, 1 to 100,000
   * @param lowWater refill when this many ids or fewer are buffered; 0 to {@code batch − 1}
   * @param maxAge the longest an id is kept after its fetch; positive
   * @return the pool, already fetching its first batch
   * @throws SnowkeepException INVALID_ARGUMENT naming {@code batch}, {@code low_water} or
   *     {@code max_age}
   */
  public IdPool pool(int batch, int lowWater, Duration maxAge) {
    checkOpen();
    return new IdPool(this, batch, lowWater, maxAge);
  }

  /**
   * The layout of the servers' namespace, from {@code InfoService.GetInfo} (read once under
   * the retry rule, then cached; a failed read is tried again on the next call).
   *
   * @return a future of the layout; it fails with a {@link SnowkeepException}
   */
  public CompletableFuture<IdLayout> layoutAsync() {
    checkOpen();
    CompletableFuture<IdLayout> cached = layout.get();
    if (cached != null && !cached.isCompletedExceptionally()) {
      return cached.copy();
    }
    CompletableFuture<IdLayout> fresh =
        UnaryCall.start(
            core, InfoServiceGrpc.getGetInfoMethod(), GetInfoRequest.getDefaultInstance(),
            SnowkeepClient::layoutOf);
    layout.compareAndSet(cached, fresh);
    return fresh.copy();
  }

  /**
   * The layout, blocking; see {@link #layoutAsync()}.
   *
   * @return the layout
   * @throws SnowkeepException when GetInfo fails
   */
  public IdLayout layout() {
    return await(layoutAsync());
  }

  /**
   * Splits {@code id} into its Unix-millisecond timestamp, machine id and sequence under the
   * layout the servers report (read once, then cached; decoding makes no call after that).
   *
   * @param id an id of the namespace (never negative)
   * @return its parts
   * @throws SnowkeepException INVALID_ARGUMENT naming {@code id} when it is above the layout's
   *     largest id, or the error of GetInfo
   */
  public DecodedId decode(long id) {
    return layout().decode(id);
  }

  /** Closes the connections; calls after it fail with FAILED_PRECONDITION "client closed". */
  @Override
  public void close() {
    core.close();
  }

  Core core() {
    return core;
  }

  private void checkOpen() {
    if (core.isClosed()) {
      throw Core.closedError();
    }
  }

  static void checkCount(int count) {
    if (count < 1 || count > MAX_COUNT) {
      throw SnowkeepException.invalid("count", count + " is outside 1 to 100000");
    }
  }

  private static long[] ids(NextIdsResponse r, int count) {
    if (r.getIdsCount() != count) {
      throw new SnowkeepException(
          Status.Code.INTERNAL, "asked for " + count + " ids, the server returned " + r.getIdsCount());
    }
    long[] out = new long[count];
    for (int i = 0; i < count; i++) {
      out[i] = r.getIds(i);
    }
    return out;
  }

  private static IdLayout layoutOf(GetInfoResponse r) {
    if (!r.hasLayout()) {
      throw new SnowkeepException(
          Status.Code.UNAUTHENTICATED, "GetInfo returned no layout (is an API key needed?)");
    }
    Layout l = r.getLayout();
    return new IdLayout(
        l.getTimestampBits(), l.getMachineBits(), l.getSequenceBits(), l.getEpochUnixMs(),
        l.getTimeUnitMs());
  }

  /**
   * Waits for {@code f}: its value, its {@link SnowkeepException}, or, when the thread is
   * interrupted, a cancellation of {@code f}.
   */
  static <T> T await(Future<T> f) {
    try {
      return f.get();
    } catch (InterruptedException e) {
      f.cancel(true);
      Thread.currentThread().interrupt();
      CancellationException c = new CancellationException("interrupted");
      c.initCause(e);
      throw c;
    } catch (ExecutionException e) {
      Throwable cause = e.getCause();
      if (cause instanceof SnowkeepException) {
        throw (SnowkeepException) cause;
      }
      if (cause instanceof RuntimeException) {
        throw (RuntimeException) cause;
      }
      throw new SnowkeepException(Status.Code.UNKNOWN, String.valueOf(cause));
    }
  }

  /** For the builder: the endpoints parsed, in order. */
  static List<Endpoint> parseAll(List<String> endpoints, boolean tls) {
    if (endpoints == null || endpoints.isEmpty()) {
      throw SnowkeepException.invalid("endpoints", "no endpoint given");
    }
    return endpoints.stream().map(e -> Endpoint.parse(e, tls)).toList();
  }
}
