package dev.snowkeep.client;

import io.grpc.ClientCall;
import io.grpc.MethodDescriptor;
import io.grpc.Status;
import io.grpc.stub.ClientCalls;
import io.grpc.stub.StreamObserver;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Future;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.function.Function;

/**
 * One unary call under the retry rule, as a future: cancelling it cancels the attempt in flight
 * (or the backoff sleep) and makes no further attempt. Package-private.
 *
 * @param <Q> the request message
 * @param <R> the response message
 * @param <T> the value the future completes with
 */
final class UnaryCall<Q, R, T> extends CompletableFuture<T> {
  private final Core core;
  private final MethodDescriptor<Q, R> method;
  private final Q request;
  private final Function<R, T> result;
  private final RetryState retry;
  private ClientCall<Q, R> current;
  private Future<?> sleeping;

  private UnaryCall(Core core, MethodDescriptor<Q, R> method, Q request, Function<R, T> result) {
    this.core = core;
    this.method = method;
    this.request = request;
    this.result = result;
    this.retry = core.retryState();
  }

  /** Starts the call; the returned future completes with {@code result} of the response. */
  static <Q, R, T> CompletableFuture<T> start(
      Core core, MethodDescriptor<Q, R> method, Q request, Function<R, T> result) {
    UnaryCall<Q, R, T> call = new UnaryCall<>(core, method, request, result);
    call.attempt();
    return call;
  }

  private void attempt() {
    if (isDone()) {
      return;
    }
    if (core.isClosed()) {
      completeExceptionally(Core.closedError());
      return;
    }
    long timeout = retry.attemptTimeout();
    if (timeout <= 0) {
      completeExceptionally(retry.lastError());
      return;
    }
    int i = retry.pick();
    ClientCall<Q, R> call = core.newCall(i, method, timeout);
    synchronized (this) {
      if (isDone()) {
        return;
      }
      current = call;
    }
    ClientCalls.asyncUnaryCall(call, request, new Observer(i));
  }

  private void failed(int i, Throwable t) {
    if (isDone()) {
      return;
    }
    Status status = Status.fromThrowable(t);
    if (core.isClosed()) {
      completeExceptionally(Core.closedError());
      return;
    }
    if (!SnowkeepException.isRetryable(status.getCode())) {
      completeExceptionally(SnowkeepException.of(status));
      return;
    }
    long delay = retry.failed(i, status);
    if (delay < 0) {
      completeExceptionally(retry.lastError());
    } else if (delay == 0) {
      attempt();
    } else {
      try {
        synchronized (this) {
          sleeping = core.scheduler.schedule(this::attempt, delay, TimeUnit.NANOSECONDS);
        }
      } catch (RejectedExecutionException e) {
        completeExceptionally(Core.closedError());
      }
    }
  }

  @Override
  public boolean cancel(boolean mayInterruptIfRunning) {
    boolean cancelled = super.cancel(mayInterruptIfRunning);
    if (cancelled) {
      synchronized (this) {
        if (current != null) {
          current.cancel("cancelled by the caller", null);
        }
        if (sleeping != null) {
          sleeping.cancel(false);
        }
      }
    }
    return cancelled;
  }

  private final class Observer implements StreamObserver<R> {
    private final int endpoint;

    Observer(int endpoint) {
      this.endpoint = endpoint;
    }

    @Override
    public void onNext(R value) {
      core.endpoints.succeeded(endpoint);
      try {
        complete(result.apply(value));
      } catch (SnowkeepException e) {
        completeExceptionally(e);
      }
    }

    @Override
    public void onError(Throwable t) {
      failed(endpoint, t);
    }

    @Override
    public void onCompleted() {}
  }
}
