package dev.snowkeep.client;

import dev.snowkeep.v1.GetInfoRequest;
import dev.snowkeep.v1.GetInfoResponse;
import dev.snowkeep.v1.IdBatch;
import dev.snowkeep.v1.IdServiceGrpc;
import dev.snowkeep.v1.InfoServiceGrpc;
import dev.snowkeep.v1.Layout;
import dev.snowkeep.v1.NextIdsRequest;
import dev.snowkeep.v1.NextIdsResponse;
import dev.snowkeep.v1.StreamIdsRequest;
import io.grpc.Context;
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
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;

/**
 * A double of snowkeep's IdService and InfoService on a loopback port. NextIds answers with
 * the next {@code count} ids of a counter (from {@code base + 1}) unless a scripted status is
 * queued; StreamIds sends batches of the counter and ends as scripted.
 */
final class FakeServer implements AutoCloseable {
  /** How one StreamIds call ends: after {@code batches} batches, with {@code end}. */
  record StreamPlan(int batches, Status end) {}

  final AtomicInteger nextIdsCalls = new AtomicInteger();
  final AtomicInteger streamCalls = new AtomicInteger();
  final AtomicInteger infoCalls = new AtomicInteger();
  final AtomicLong counter;
  final ConcurrentLinkedQueue<Status> nextIdsScript = new ConcurrentLinkedQueue<>();
  final ConcurrentLinkedQueue<StreamPlan> streamScript = new ConcurrentLinkedQueue<>();
  final List<Long> streamTotals = new CopyOnWriteArrayList<>();
  final List<String> authorization = new CopyOnWriteArrayList<>();
  final CountDownLatch cancelled = new CountDownLatch(1);
  volatile Status always;
  volatile boolean hang;
  volatile Layout layout =
      Layout.newBuilder()
          .setTimestampBits(41).setMachineBits(10).setSequenceBits(12)
          .setEpochUnixMs(1_700_000_000_000L).build();
  private final Server server;

  FakeServer(long base) throws IOException {
    counter = new AtomicLong(base);
    server =
        NettyServerBuilder.forAddress(new java.net.InetSocketAddress("127.0.0.1", 0))
            .addService(ServerInterceptors.intercept(new Ids(), new Auth()))
            .addService(new Info())
            .build()
            .start();
  }

  String url() {
    return "http://127.0.0.1:" + server.getPort();
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

  private Status scripted(ConcurrentLinkedQueue<Status> script) {
    Status s = script.poll();
    return s != null ? s : always;
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

  private final class Ids extends IdServiceGrpc.IdServiceImplBase {
    @Override
    public void nextIds(NextIdsRequest request, StreamObserver<NextIdsResponse> out) {
      nextIdsCalls.incrementAndGet();
      if (hang) {
        Context.current().addListener(c -> cancelled.countDown(), Runnable::run);
        return;
      }
      Status s = scripted(nextIdsScript);
      if (s != null) {
        out.onError(s.asRuntimeException());
        return;
      }
      NextIdsResponse.Builder b = NextIdsResponse.newBuilder();
      long first = counter.getAndAdd(request.getCount()) + 1;
      for (long k = 0; k < request.getCount(); k++) {
        b.addIds(first + k);
      }
      out.onNext(b.build());
      out.onCompleted();
    }

    @Override
    public void streamIds(StreamIdsRequest request, StreamObserver<IdBatch> out) {
      streamCalls.incrementAndGet();
      streamTotals.add(request.getTotal());
      StreamPlan plan = streamScript.poll();
      long left = request.getTotal();
      int size = request.getBatchSize() == 0 ? 1000 : request.getBatchSize();
      int sent = 0;
      while (left > 0 && (plan == null || sent < plan.batches())) {
        int n = (int) Math.min(size, left);
        IdBatch.Builder b = IdBatch.newBuilder();
        long first = counter.getAndAdd(n) + 1;
        for (long k = 0; k < n; k++) {
          b.addIds(first + k);
        }
        out.onNext(b.build());
        left -= n;
        sent++;
      }
      if (plan == null || plan.end().isOk()) {
        out.onCompleted();
      } else {
        out.onError(plan.end().asRuntimeException());
      }
    }
  }

  private final class Info extends InfoServiceGrpc.InfoServiceImplBase {
    @Override
    public void getInfo(GetInfoRequest request, StreamObserver<GetInfoResponse> out) {
      infoCalls.incrementAndGet();
      out.onNext(GetInfoResponse.newBuilder().setVersion("test").setLayout(layout).build());
      out.onCompleted();
    }
  }
}
