package dev.snowkeep.client;

import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ChannelCredentials;
import io.grpc.ClientCall;
import io.grpc.ClientInterceptor;
import io.grpc.ClientInterceptors;
import io.grpc.Grpc;
import io.grpc.InsecureChannelCredentials;
import io.grpc.ManagedChannel;
import io.grpc.Metadata;
import io.grpc.MethodDescriptor;
import io.grpc.stub.MetadataUtils;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;

/**
 * What every call of a client shares: the endpoints and their channels, the settings, the
 * scheduler of backoff sleeps. Package-private.
 */
final class Core {
  final Endpoints endpoints;
  final Settings settings;
  final ScheduledExecutorService scheduler;
  private final List<Channel> channels = new ArrayList<>();
  private volatile boolean closed;

  Core(List<Endpoint> list, Settings settings, ChannelCredentials tls, String apiKey) {
    this.settings = settings;
    this.endpoints = new Endpoints(list, settings.backoffNanos, settings.maxBackoffNanos, System::nanoTime);
    this.scheduler =
        Executors.newSingleThreadScheduledExecutor(
            r -> {
              Thread t = new Thread(r, "snowkeep-client-backoff");
              t.setDaemon(true);
              return t;
            });
    ClientInterceptor[] interceptors = interceptors(apiKey);
    for (Endpoint e : list) {
      ChannelCredentials creds = e.tls ? tls : InsecureChannelCredentials.create();
      e.channel =
          Grpc.newChannelBuilderForAddress(e.host, e.port, creds)
              .maxInboundMessageSize(64 << 20)
              .build();
      channels.add(ClientInterceptors.intercept(e.channel, interceptors));
    }
  }

  /** The interceptors that send {@code apiKey} (none for null); shared with the embedded generator. */
  static ClientInterceptor[] interceptors(String apiKey) {
    if (apiKey == null) {
      return new ClientInterceptor[0];
    }
    Metadata headers = new Metadata();
    headers.put(Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER), "Bearer " + apiKey);
    return new ClientInterceptor[] {MetadataUtils.newAttachHeadersInterceptor(headers)};
  }

  /** A new random factor source for jitter. */
  double random() {
    return ThreadLocalRandom.current().nextDouble();
  }

  /** A retry state for one call, starting its budget now. */
  RetryState retryState() {
    return new RetryState(endpoints, settings, System::nanoTime, this::random);
  }

  /**
   * A call of {@code method} on endpoint {@code i} with a deadline of {@code timeoutNanos} (0: no
   * deadline). An endpoint that failed before gets its connection backoff reset, so that a
   * server that came back is reached at once.
   */
  <Q, R> ClientCall<Q, R> newCall(int i, MethodDescriptor<Q, R> method, long timeoutNanos) {
    if (endpoints.hasFailed(i)) {
      endpoints.all().get(i).channel.resetConnectBackoff();
    }
    CallOptions options = CallOptions.DEFAULT;
    if (timeoutNanos > 0) {
      options = options.withDeadlineAfter(timeoutNanos, TimeUnit.NANOSECONDS);
    }
    return channels.get(i).newCall(method, options);
  }

  /** Whether {@link #close()} ran. */
  boolean isClosed() {
    return closed;
  }

  /** The error of a call after close. */
  static SnowkeepException closedError() {
    return new SnowkeepException(io.grpc.Status.Code.FAILED_PRECONDITION, "client closed");
  }

  /** Shuts the channels down (in-flight calls are cancelled) and stops the scheduler. */
  void close() {
    closed = true;
    for (Endpoint e : endpoints.all()) {
      ManagedChannel c = e.channel;
      c.shutdownNow();
    }
    scheduler.shutdownNow();
    for (Endpoint e : endpoints.all()) {
      try {
        e.channel.awaitTermination(5, TimeUnit.SECONDS);
      } catch (InterruptedException ex) {
        Thread.currentThread().interrupt();
        return;
      }
    }
  }
}
