package dev.snowkeep.client;

import dev.snowkeep.v1.IdBatch;
import dev.snowkeep.v1.IdServiceGrpc;
import dev.snowkeep.v1.StreamIdsRequest;
import io.grpc.ClientCall;
import io.grpc.Metadata;
import io.grpc.Status;
import java.util.Iterator;
import java.util.NoSuchElementException;
import java.util.Spliterator;
import java.util.Spliterators;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.CancellationException;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.stream.LongStream;
import java.util.stream.Stream;
import java.util.stream.StreamSupport;

/**
 * Exactly {@code total} ids from {@code StreamIds}, batch by batch, as a blocking {@link
 * Iterator} of {@code long[]} batches (or {@link #batches()}, {@link #ids()}).
 *
 * <p>The guarantee: every id is unique; ids ascend within each server's part of the stream (a
 * part resumed on another server may start below the previous part's last id, since it comes
 * from another machine id); on success exactly {@code total} ids are delivered, never more,
 * never fewer. When a server ends the stream early with a retryable code (it shut down, was
 * killed, lost its lease), the stream asks the next endpoint for the remaining ids and goes on;
 * the retry budget restarts with each batch. A non-retryable end, or a spent budget, is thrown
 * by {@link #hasNext()} as a {@link SnowkeepException} after the batches already delivered; it
 * is thrown again by every later call. Each wait for a batch is bounded by the request timeout
 * (then the attempt counts as a {@code DEADLINE_EXCEEDED} failure).
 *
 * <p>Batches are fetched as they are read (gRPC flow control): a slow reader is not sent ids it
 * has not asked for. Not thread-safe, except {@link #close()}: closing it from another thread
 * cancels the call, and a reader blocked in {@link #hasNext()} gets a {@link
 * CancellationException}.
 */
public final class IdStream implements Iterator<long[]>, AutoCloseable {
  private final Core core;
  private final long total;
  private final int batchSize;
  private final RetryState retry;
  private final Object sleeper = new Object();
  private long received;
  private long[] pending;
  private boolean delivered;
  private Attempt current;
  private RuntimeException error;
  private volatile boolean closed;

  IdStream(Core core, long total, int batchSize) {
    this.core = core;
    this.total = total;
    this.batchSize = batchSize;
    this.retry = core.retryState();
  }

  /**
   * Whether another batch follows; blocks until it arrives.
   *
   * @return false once exactly {@code total} ids were delivered
   * @throws SnowkeepException the error that ended the stream early (see the class comment)
   * @throws CancellationException when the stream was closed before its end, or the thread was
   *     interrupted (which closes it)
   */
  @Override
  public boolean hasNext() {
    if (pending != null) {
      return true;
    }
    if (error != null) {
      throw error;
    }
    if (received >= total) {
      return false;
    }
    try {
      pending = fetch();
    } catch (RuntimeException e) {
      error = e;
      close();
      throw e;
    }
    return true;
  }

  /**
   * The next batch: ascending ids, each in [0, 2^63 − 1].
   *
   * @return the batch (never empty)
   * @throws NoSuchElementException after the last batch
   * @throws SnowkeepException as {@link #hasNext()}
   */
  @Override
  public long[] next() {
    if (!hasNext()) {
      throw new NoSuchElementException("all " + total + " ids were delivered");
    }
    long[] batch = pending;
    pending = null;
    return batch;
  }

  /**
   * Ids delivered so far.
   *
   * @return the count, at most {@code total}
   */
  public long received() {
    return received;
  }

  /**
   * Ids asked for.
   *
   * @return {@code total}
   */
  public long total() {
    return total;
  }

  /**
   * The batches as a sequential {@link Stream}; closing the stream closes this.
   *
   * @return the batches
   */
  public Stream<long[]> batches() {
    Spliterator<long[]> s =
        Spliterators.spliteratorUnknownSize(this, Spliterator.ORDERED | Spliterator.NONNULL);
    return StreamSupport.stream(s, false).onClose(this::close);
  }

  /**
   * The ids one by one as a sequential {@link LongStream}; closing it closes this.
   *
   * @return the ids
   */
  public LongStream ids() {
    return batches().flatMapToLong(LongStream::of);
  }

  /** Cancels the call in flight; safe to call more than once and from any thread. */
  @Override
  public void close() {
    closed = true;
    Attempt a = current;
    if (a != null) {
      a.call.cancel("stream closed by the caller", null);
    }
    synchronized (sleeper) {
      sleeper.notifyAll();
    }
  }

  private long[] fetch() {
    if (delivered) {
      retry.restart();
      delivered = false;
    }
    while (true) {
      checkOpen();
      if (current == null) {
        long timeout = retry.attemptTimeout();
        if (timeout <= 0) {
          throw retry.lastError();
        }
        current = open();
      }
      Object event = poll(current);
      if (event instanceof IdBatch) {
        long[] ids = take((IdBatch) event);
        if (ids != null) {
          return ids;
        }
        continue;
      }
      Attempt ended = current;
      current = null;
      checkOpen();
      Status status = (Status) event;
      if (status.isOk()) {
        status = Status.UNAVAILABLE.withDescription(
            "the server ended the stream with OK after " + received + " of " + total + " ids");
      }
      if (!SnowkeepException.isRetryable(status.getCode())) {
        throw SnowkeepException.of(status);
      }
      long delay = retry.failed(ended.endpoint, status);
      if (delay < 0) {
        throw retry.lastError();
      }
      sleep(delay);
    }
  }

  private Attempt open() {
    int i = retry.pick();
    StreamIdsRequest request =
        StreamIdsRequest.newBuilder().setTotal(total - received).setBatchSize(batchSize).build();
    ClientCall<StreamIdsRequest, IdBatch> call = core.newCall(i, IdServiceGrpc.getStreamIdsMethod(), 0);
    Attempt a = new Attempt(i, call);
    call.start(a, new Metadata());
    call.sendMessage(request);
    call.halfClose();
    call.request(2);
    return a;
  }

  /** The next event of {@code a}, or a DEADLINE_EXCEEDED status after the attempt's deadline. */
  private Object poll(Attempt a) {
    long wait = Math.max(retry.attemptTimeout(), 1);
    Object event;
    try {
      event = a.events.poll(wait, TimeUnit.NANOSECONDS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      close();
      throw cancelled();
    }
    if (event == null) {
      a.call.cancel("no batch in time", null);
      return Status.DEADLINE_EXCEEDED.withDescription(
          "no batch within " + TimeUnit.NANOSECONDS.toMillis(wait) + " ms");
    }
    return event;
  }

  /** Counts a batch in: its ids up to {@code total}, or null for an empty batch. */
  private long[] take(IdBatch batch) {
    current.call.request(1);
    int n = batch.getIdsCount();
    if (n == 0) {
      return null;
    }
    core.endpoints.succeeded(current.endpoint);
    delivered = true;
    int keep = (int) Math.min(n, total - received);
    long[] ids = new long[keep];
    for (int k = 0; k < keep; k++) {
      ids[k] = batch.getIds(k);
    }
    received += keep;
    if (received >= total && keep < n) {
      current.call.cancel("more ids than asked for", null);
    }
    return ids;
  }

  private void sleep(long nanos) {
    long end = System.nanoTime() + nanos;
    synchronized (sleeper) {
      long left;
      while (!closed && (left = end - System.nanoTime()) > 0) {
        try {
          TimeUnit.NANOSECONDS.timedWait(sleeper, left);
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
          close();
          throw cancelled();
        }
      }
    }
  }

  private void checkOpen() {
    if (core.isClosed()) {
      throw Core.closedError();
    }
    if (closed) {
      throw cancelled();
    }
  }

  private CancellationException cancelled() {
    return new CancellationException("stream closed after " + received + " of " + total + " ids");
  }

  /** One call of the stream: its events, in order. */
  private static final class Attempt extends ClientCall.Listener<IdBatch> {
    final int endpoint;
    final ClientCall<StreamIdsRequest, IdBatch> call;
    final BlockingQueue<Object> events = new LinkedBlockingQueue<>();

    Attempt(int endpoint, ClientCall<StreamIdsRequest, IdBatch> call) {
      this.endpoint = endpoint;
      this.call = call;
    }

    @Override
    public void onMessage(IdBatch message) {
      events.add(message);
    }

    @Override
    public void onClose(Status status, Metadata trailers) {
      events.add(status);
    }
  }
}
