package dev.snowkeep.client;

import dev.snowkeep.v1.AcquireRequest;
import dev.snowkeep.v1.CheckRequest;
import dev.snowkeep.v1.CheckResponse;
import dev.snowkeep.v1.LeaseCheckReason;
import dev.snowkeep.v1.LeaseGrant;
import dev.snowkeep.v1.LeaseServiceGrpc;
import dev.snowkeep.v1.LeasedMachineId;
import dev.snowkeep.v1.ReleaseRequest;
import dev.snowkeep.v1.ReleaseResponse;
import dev.snowkeep.v1.RenewRequest;
import io.grpc.Metadata;
import io.grpc.Server;
import io.grpc.ServerCall;
import io.grpc.ServerCallHandler;
import io.grpc.ServerInterceptor;
import io.grpc.ServerInterceptors;
import io.grpc.Status;
import io.grpc.netty.shaded.io.grpc.netty.NettyServerBuilder;
import io.grpc.stub.StreamObserver;
import java.io.IOException;
import java.util.List;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;

/**
 * A double of snowkeep's LeaseService on a loopback port. Each RPC answers with the next
 * scripted answer (a message or a {@link Status}), else its default: Acquire and Renew the
 * {@link #grant}, Check "valid", Release the count of machine ids it was given. It records every
 * request and the {@link ManualTime} monotonic time it arrived at.
 */
final class FakeLeaseServer implements AutoCloseable {
  static final long EPOCH = 1_767_225_600_000L;
  static final String TOKEN = "ab".repeat(32);

  final ConcurrentLinkedQueue<Object> acquireScript = new ConcurrentLinkedQueue<>();
  final ConcurrentLinkedQueue<Object> renewScript = new ConcurrentLinkedQueue<>();
  final ConcurrentLinkedQueue<Object> checkScript = new ConcurrentLinkedQueue<>();
  final List<AcquireRequest> acquires = new CopyOnWriteArrayList<>();
  final List<RenewRequest> renews = new CopyOnWriteArrayList<>();
  final List<CheckRequest> checks = new CopyOnWriteArrayList<>();
  final List<ReleaseRequest> releases = new CopyOnWriteArrayList<>();
  /** Monotonic ns of each Renew and Check, as {@link ManualTime} read it. */
  final List<Long> renewTimes = new CopyOnWriteArrayList<>();
  final List<Long> checkTimes = new CopyOnWriteArrayList<>();
  final List<String> authorization = new CopyOnWriteArrayList<>();
  volatile LeaseGrant grant;
  /** When set, Renew never answers (a stopped server). */
  volatile boolean hangRenew;
  private final LeaseTime time;
  private final Server server;

  FakeLeaseServer(LeaseTime time, LeaseGrant grant) throws IOException {
    this.time = time;
    this.grant = grant;
    server = NettyServerBuilder.forAddress(new java.net.InetSocketAddress("127.0.0.1", 0))
        .addService(ServerInterceptors.intercept(new Lease(), new Auth()))
        .build()
        .start();
  }

  String url() {
    return "http://127.0.0.1:" + server.getPort();
  }

  /** The default layout: 41/12/10 from 2026-01-01, 1 ms. */
  static dev.snowkeep.v1.Layout layout() {
    return layout(41, 12, 10, 1);
  }

  static dev.snowkeep.v1.Layout layout(int t, int m, int s, int unit) {
    return dev.snowkeep.v1.Layout.newBuilder().setTimestampBits(t).setMachineBits(m)
        .setSequenceBits(s).setEpochUnixMs(EPOCH).setTimeUnitMs(unit).build();
  }

  /** A grant of {@code ids} with one floor and fence (layout ms), lasting {@code expiresMs}. */
  static LeaseGrant grant(long expiresMs, long floorMs, long fenceMs, int... ids) {
    LeaseGrant.Builder b = LeaseGrant.newBuilder().setLayout(layout()).setExpiresInMs(expiresMs)
        .setLeaseDurationMs(expiresMs).setLeaseToken(TOKEN).setNamespaceIncarnation(77);
    for (int id : ids) {
      b.addMachineIds(LeasedMachineId.newBuilder().setMachineId(id).setFloorMs(floorMs).setFenceMs(fenceMs));
    }
    return b.build();
  }

  static CheckResponse invalid(LeaseCheckReason reason) {
    return CheckResponse.newBuilder().setValid(false).setReason(reason).setDetail("scripted").build();
  }

  @Override
  public void close() {
    server.shutdownNow();
    try {
      server.awaitTermination(5, TimeUnit.SECONDS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }

  @SuppressWarnings("unchecked")
  private static <T> void answer(ConcurrentLinkedQueue<Object> script, T fallback, StreamObserver<T> out) {
    Object next = script.poll();
    // A Runnable in the script runs during the call (the clock moving while
    // the answer travels, say); the next entry is the answer.
    while (next instanceof Runnable) {
      ((Runnable) next).run();
      next = script.poll();
    }
    if (next == null) {
      next = fallback;
    }
    if (next instanceof Status) {
      out.onError(((Status) next).asRuntimeException());
      return;
    }
    out.onNext((T) next);
    out.onCompleted();
  }

  private final class Lease extends LeaseServiceGrpc.LeaseServiceImplBase {
    @Override
    public void acquire(AcquireRequest request, StreamObserver<LeaseGrant> out) {
      acquires.add(request);
      answer(acquireScript, grant, out);
    }

    @Override
    public void renew(RenewRequest request, StreamObserver<LeaseGrant> out) {
      renews.add(request);
      renewTimes.add(time.nanoTime());
      if (hangRenew) {
        return;
      }
      answer(renewScript, grant.toBuilder().clearLeaseToken().build(), out);
    }

    @Override
    public void check(CheckRequest request, StreamObserver<CheckResponse> out) {
      checks.add(request);
      checkTimes.add(time.nanoTime());
      CheckResponse valid = CheckResponse.newBuilder().setValid(true)
          .setReason(LeaseCheckReason.LEASE_CHECK_REASON_VALID).setRemainingMs(1000).build();
      answer(checkScript, valid, out);
    }

    @Override
    public void release(ReleaseRequest request, StreamObserver<ReleaseResponse> out) {
      releases.add(request);
      out.onNext(ReleaseResponse.newBuilder().setReleased(grant.getMachineIdsCount()).build());
      out.onCompleted();
    }
  }

  private final class Auth implements ServerInterceptor {
    @Override
    public <Q, R> ServerCall.Listener<Q> interceptCall(
        ServerCall<Q, R> call, Metadata headers, ServerCallHandler<Q, R> next) {
      String a = headers.get(Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER));
      authorization.add(a == null ? "" : a);
      return next.startCall(call, headers);
    }
  }
}
