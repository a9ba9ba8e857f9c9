package dev.snowkeep.bench;

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
import io.grpc.Server;
import io.grpc.netty.shaded.io.grpc.netty.NettyServerBuilder;
import io.grpc.stub.StreamObserver;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.util.concurrent.TimeUnit;

/**
 * A LeaseService on a loopback port that grants whatever count is asked for, machine ids from 0,
 * under {@link #LAYOUT}, floor 0 and a fence an hour ahead, for an hour: enough for a benchmark
 * to stamp without a network hop and without ever waiting on the lease.
 */
final class LeaseDouble implements AutoCloseable {
  /** 2026-01-01T00:00:00Z. */
  static final long EPOCH = 1_767_225_600_000L;
  /**
   * 41 timestamp bits in ms, 2 machine bits, 20 sequence bits: 1,048,576 ids per ms per machine
   * id, so a benchmark loop measures the generator, not the wait for the next millisecond (at
   * 10 sequence bits a tight loop is capped at 1,024 ids per ms, about 1 µs per id).
   */
  static final dev.snowkeep.v1.Layout LAYOUT = dev.snowkeep.v1.Layout.newBuilder()
      .setTimestampBits(41).setMachineBits(2).setSequenceBits(20).setEpochUnixMs(EPOCH)
      .setTimeUnitMs(1).build();

  private final Server server;

  LeaseDouble() throws IOException {
    server = NettyServerBuilder.forAddress(new InetSocketAddress("127.0.0.1", 0))
        .addService(new Lease()).build().start();
  }

  String url() {
    return "http://127.0.0.1:" + server.getPort();
  }

  private static LeaseGrant grant(int count) {
    long fence = System.currentTimeMillis() - EPOCH + 3_600_000;
    LeaseGrant.Builder b = LeaseGrant.newBuilder().setLayout(LAYOUT).setExpiresInMs(3_600_000)
        .setLeaseDurationMs(3_600_000).setLeaseToken("ab".repeat(32));
    for (int i = 0; i < count; i++) {
      b.addMachineIds(LeasedMachineId.newBuilder().setMachineId(i).setFloorMs(0).setFenceMs(fence));
    }
    return b.build();
  }

  @Override
  public void close() throws InterruptedException {
    server.shutdownNow();
    server.awaitTermination(5, TimeUnit.SECONDS);
  }

  private static final class Lease extends LeaseServiceGrpc.LeaseServiceImplBase {
    private volatile int count;

    @Override
    public void acquire(AcquireRequest request, StreamObserver<LeaseGrant> out) {
      count = request.getCount();
      out.onNext(grant(count));
      out.onCompleted();
    }

    @Override
    public void renew(RenewRequest request, StreamObserver<LeaseGrant> out) {
      out.onNext(grant(count).toBuilder().clearLeaseToken().build());
      out.onCompleted();
    }

    @Override
    public void check(CheckRequest request, StreamObserver<CheckResponse> out) {
      out.onNext(CheckResponse.newBuilder().setValid(true)
          .setReason(LeaseCheckReason.LEASE_CHECK_REASON_VALID).build());
      out.onCompleted();
    }

    @Override
    public void release(ReleaseRequest request, StreamObserver<ReleaseResponse> out) {
      out.onNext(ReleaseResponse.newBuilder().setReleased(count).build());
      out.onCompleted();
    }
  }
}
