package dev.snowkeep.client;

import dev.snowkeep.v1.AcquireRequest;
import dev.snowkeep.v1.LeaseGrant;
import dev.snowkeep.v1.LeaseServiceGrpc;
import dev.snowkeep.v1.LeasedMachineId;
import io.grpc.Channel;
import io.grpc.ChannelCredentials;
import io.grpc.ClientInterceptors;
import io.grpc.Grpc;
import io.grpc.InsecureChannelCredentials;
import io.grpc.ManagedChannel;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.lang.System.Logger.Level;
import java.util.Arrays;
import java.util.Map;
import java.util.concurrent.TimeUnit;

/**
 * How an embedded generator starts (Rust: {@code EmbeddedGenerator::start_on} and {@code accept}
 * in {@code client/src/embedded/mod.rs}): the channel, the Acquire loop with its retry schedule
 * and nonce switch, the fail-fast rules on the grant (each releasing it before throwing), and the
 * wait for the clock to pass the granted floor. Package-private.
 */
final class LeaseStart {
  private static final System.Logger LOG = System.getLogger(EmbeddedGenerator.class.getName());

  private LeaseStart() {}

  /** {@link EmbeddedGeneratorBuilder#start()} after the settings were checked. */
  static EmbeddedGenerator start(EmbeddedGeneratorBuilder config) {
    Endpoint endpoint = Endpoint.parse(config.endpoint, config.tls);
    SnowkeepClientBuilder.checkApiKey(config.apiKey);
    // Checked whatever the endpoint's scheme, as SnowkeepClientBuilder#build checks them.
    ChannelCredentials tls =
        SnowkeepClientBuilder.credentials(config.tls, config.caFile, config.certFile, config.keyFile);
    ChannelCredentials creds = endpoint.tls ? tls : InsecureChannelCredentials.create();
    ManagedChannel channel = Grpc.newChannelBuilderForAddress(endpoint.host, endpoint.port, creds).build();
    Channel intercepted = ClientInterceptors.intercept(channel, Core.interceptors(config.apiKey));
    LeaseServiceGrpc.LeaseServiceBlockingStub stub = LeaseServiceGrpc.newBlockingStub(intercepted);
    try {
      return acquire(config, stub, channel);
    } catch (RuntimeException e) {
      channel.shutdownNow();
      throw e;
    }
  }

  /** The Acquire loop, then {@link #accept}; releases the grant when accept fails. */
  private static EmbeddedGenerator acquire(
      EmbeddedGeneratorBuilder config, LeaseServiceGrpc.LeaseServiceBlockingStub stub, ManagedChannel channel) {
    LeaseTime time = config.time;
    Requester requester = config.requester != null ? config.requester : Requester.current();
    long timeout = config.requestTimeout.toNanos();
    long backoff = config.acquireBackoff.toNanos();
    boolean switched = false;
    LeaseGrant grant;
    long sent;
    for (int attempt = 1; ; attempt++) {
      sent = time.nanoTime();
      AcquireRequest.Builder request = AcquireRequest.newBuilder()
          .setRequester(requester.toProto())
          .setNamespace(config.namespace)
          .setCount(config.machineIds)
          // The generator honours time units and every total of bits.
          .setSupportsLayoutShapes(true);
      if (config.sendClientTime) {
        request.setClientTimeUnixMs(time.unixMs());
      }
      try {
        grant = stub.withDeadlineAfter(timeout, TimeUnit.NANOSECONDS).acquire(request.build());
        break;
      } catch (StatusRuntimeException e) {
        Status.Code code = e.getStatus().getCode();
        if (!switched && code == Status.Code.PERMISSION_DENIED) {
          // This identity holds machine ids we have no token for (a lost Acquire answer):
          // start over as a new requester; the lost ones free themselves when their lease ends.
          switched = true;
          attempt--;
          requester = requester.withNewNonce();
          LOG.log(Level.WARNING, "this requester identity already holds machine ids without our lease token; acquiring as requester {0}", requester.tag());
          continue;
        }
        if (!SnowkeepException.isRetryable(code) || config.acquireAttempts > 0 && attempt >= config.acquireAttempts) {
          throw SnowkeepException.of(e.getStatus());
        }
        long wait = (long) (backoff * (0.8 + 0.4 * config.random.getAsDouble()));
        backoff = Math.min(backoff * 2, config.acquireMaxBackoff.toNanos());
        LOG.log(Level.WARNING, "Acquire failed in namespace {0} ({1}); retrying in {2} ms",
            config.namespace, e.getStatus(), wait / 1_000_000);
        EmbeddedGenerator.sleep(time, wait);
      }
    }
    try {
      return accept(config, stub, channel, requester, grant, sent);
    } catch (RuntimeException e) {
      // The server holds machine ids for us: give them back before failing.
      int released = LeaseKeeper.release(stub.withDeadlineAfter(timeout, TimeUnit.NANOSECONDS),
          config, requester, grant.getLeaseToken(), Map.of());
      LOG.log(Level.WARNING, "refused the grant and released {0} machine ids: {1}", released, e.getMessage());
      throw e;
    }
  }

  /** Checks a fresh grant, waits for the clock to pass its floor and starts the lease tasks. */
  private static EmbeddedGenerator accept(EmbeddedGeneratorBuilder config, LeaseServiceGrpc.LeaseServiceBlockingStub stub,
      ManagedChannel channel, Requester requester, LeaseGrant grant, long sent) {
    LeaseTime time = config.time;
    IdLayout layout = checkGrant(grant, config.machineIds);
    long past = LeaseKeeper.pastFenceMs(layout, time.unixMs(), grant);
    if (past > 0) {
      throw new GrantRejectedException(GrantRejectedException.Kind.CLOCK_PAST_FENCE,
          "the local clock is " + past + " ms past a granted fence (ahead of the server's by more than the lease covers): sync this host with NTP");
    }
    long deadline = LeaseKeeper.deadlineOf(sent, grant);
    if (time.nanoTime() >= deadline) {
      // Accepted, it would stop at once with EXPIRED and never release.
      throw new GrantRejectedException(GrantRejectedException.Kind.GRANT_EXPIRED,
          "the grant expired before its answer arrived (the Acquire took longer than the lease it grants)");
    }
    long maxFloor = 0;
    for (LeasedMachineId m : grant.getMachineIdsList()) {
      maxFloor = Math.max(maxFloor, LeaseKeeper.floorOf(m));
    }
    long now = Math.max(0, time.unixMs() - layout.epochUnixMs());
    // In ms first: a floor far ahead would overflow the ns and pass for no wait.
    long waitMs = Math.max(0, layout.firstStampAfter(maxFloor) - now);
    // Never wait past the lease either: it would end before the first id.
    long maxNanos = Math.min(config.maxFloorWait.toNanos(), Math.max(0, deadline - time.nanoTime()));
    if (waitMs > maxNanos / 1_000_000) {
      throw new GrantRejectedException(GrantRejectedException.Kind.CLOCK_BEHIND_FLOOR,
          "the local clock is " + waitMs + " ms behind the granted floor, more than the "
              + maxNanos / 1_000_000 + " ms start waits (max_floor_wait, or the lease): sync this host with NTP");
    }
    long waitNanos = waitMs * 1_000_000;
    LeaseKeeper keeper = new LeaseKeeper(config, stub, requester, grant, layout);
    keeper.publish(grant, sent);
    if (waitNanos > 0) {
      LOG.log(Level.INFO, "waiting {0} ms for the clock to pass the claimed machine ids'' floor", waitNanos / 1_000_000);
      EmbeddedGenerator.sleep(time, waitNanos);
    }
    keeper.begin(deadline);
    LOG.log(Level.INFO, "embedded generator leased machine ids {0} in namespace {1} as requester {2}",
        Arrays.toString(keeper.machineIds), config.namespace, requester.tag());
    return new EmbeddedGenerator(keeper, channel);
  }

  /** The fail-fast rules on a grant's shape; returns its layout. */
  static IdLayout checkGrant(LeaseGrant grant, int asked) {
    if (!grant.hasLayout()) {
      throw new GrantRejectedException(GrantRejectedException.Kind.INVALID_LAYOUT, "the grant carries no layout");
    }
    dev.snowkeep.v1.Layout l = grant.getLayout();
    IdLayout layout = new IdLayout(l.getTimestampBits(), l.getMachineBits(), l.getSequenceBits(),
        l.getEpochUnixMs(), l.getTimeUnitMs());
    String problem = layout.problem();
    if (problem != null) {
      throw new GrantRejectedException(GrantRejectedException.Kind.INVALID_LAYOUT, problem);
    }
    if (grant.getMachineIdsCount() != asked) {
      throw new GrantRejectedException(GrantRejectedException.Kind.GRANT_COUNT,
          "asked for " + asked + " machine ids, granted " + grant.getMachineIdsCount());
    }
    java.util.Set<Integer> seen = new java.util.HashSet<>();
    for (LeasedMachineId m : grant.getMachineIdsList()) {
      if (!seen.add(m.getMachineId())) {
        // Two generators on one machine id would stamp the same ids: never use such a grant.
        throw new GrantRejectedException(GrantRejectedException.Kind.GRANT_COUNT,
            "machine id " + Integer.toUnsignedString(m.getMachineId()) + " is granted twice");
      }
      if (Integer.toUnsignedLong(m.getMachineId()) >= layout.machineIdCount()) {
        throw new GrantRejectedException(GrantRejectedException.Kind.MACHINE_ID_OUT_OF_RANGE,
            "machine id " + Integer.toUnsignedString(m.getMachineId()) + " does not fit "
                + layout.machineBits() + " machine bits");
      }
    }
    if (grant.getExpiresInMs() == 0) {
      throw new GrantRejectedException(GrantRejectedException.Kind.GRANT_EXPIRED, "the grant is already expired");
    }
    return layout;
  }
}
