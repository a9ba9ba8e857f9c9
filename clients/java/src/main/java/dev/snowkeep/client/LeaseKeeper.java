package dev.snowkeep.client;

import dev.snowkeep.v1.CheckRequest;
import dev.snowkeep.v1.CheckResponse;
import dev.snowkeep.v1.LeaseCheckReason;
import dev.snowkeep.v1.LeaseGrant;
import dev.snowkeep.v1.LeaseServiceGrpc;
import dev.snowkeep.v1.LeasedMachineId;
import dev.snowkeep.v1.ReleaseRequest;
import dev.snowkeep.v1.RenewRequest;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.lang.System.Logger.Level;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

/**
 * Keeps a started generator's lease (Rust: {@code client/src/embedded/renewal.rs} and the
 * {@code Shared} of {@code mod.rs}): the renew task (renew at once, then at half the remaining
 * lease; while behind every {@code min(10 min, remaining/4)}, at least 5 s apart; the local
 * deadline), the check task (every {@code checkInterval}), the stop rules, and release after
 * drain. Both tasks run on one scheduler thread, one at a time. Package-private.
 */
final class LeaseKeeper {
  private static final System.Logger LOG = System.getLogger(EmbeddedGenerator.class.getName());
  /** Renewal retries while behind: never more often than this ... */
  static final long MIN_RETRY_NANOS = TimeUnit.SECONDS.toNanos(5);
  /** ... and never less often than this. */
  static final long MAX_RETRY_NANOS = TimeUnit.MINUTES.toNanos(10);

  /** Why issuance stopped, with the detail for the exception. */
  private record Stop(StopReason reason, String detail) {}

  final EmbeddedGeneratorBuilder config;
  final LeaseTime time;
  final Requester requester;
  final IdLayout layout;
  final int[] machineIds;
  final Slot[] slots;
  private final LeaseServiceGrpc.LeaseServiceBlockingStub stub;
  private final String token;
  private final long incarnation;
  private final CompletableFuture<StopReason> stopped = new CompletableFuture<>();
  private volatile Stop stop;
  private LeaseTime.Scheduler scheduler;
  /** The local deadline (on {@link LeaseTime#nanoTime()}); used by the scheduler thread only. */
  private long deadline;

  LeaseKeeper(EmbeddedGeneratorBuilder config, LeaseServiceGrpc.LeaseServiceBlockingStub stub,
      Requester requester, LeaseGrant grant, IdLayout layout) {
    this.config = config;
    this.time = config.time;
    this.stub = stub;
    this.requester = requester;
    this.token = grant.getLeaseToken();
    this.incarnation = grant.getNamespaceIncarnation();
    this.layout = layout;
    this.machineIds = grant.getMachineIdsList().stream().mapToInt(LeasedMachineId::getMachineId).toArray();
    long backward = config.maxBackwardWait.toMillis();
    this.slots = new Slot[machineIds.length];
    for (int i = 0; i < slots.length; i++) {
      slots[i] = new Slot(i, layout, time, backward, this::noGrant);
    }
  }

  /** The error of a step that finds no grant: stopped for good, or not (yet) granted. */
  RuntimeException noGrant() {
    Stop s = stop;
    if (s != null) {
      return new GeneratorStoppedException(s.reason(), s.detail());
    }
    return new IdGenerationException(IdGenerationException.Kind.NO_GRANT, "no valid machine-id lease is held");
  }

  /** The reason issuance stopped, or null. */
  StopReason reason() {
    Stop s = stop;
    return s == null ? null : s.reason();
  }

  CompletableFuture<StopReason> stopped() {
    return stopped;
  }

  /** A stub with the request timeout as its deadline. */
  LeaseServiceGrpc.LeaseServiceBlockingStub call() {
    return stub.withDeadlineAfter(config.requestTimeout.toNanos(), TimeUnit.NANOSECONDS);
  }

  /**
   * A stub whose deadline is the request timeout or the lease's local deadline, whichever comes
   * first: a Renew or Check that hangs (a stopped server answers nothing until the call's
   * timeout) must not hold the {@link StopReason#EXPIRED} stop past the deadline, since both
   * tasks run on one thread. (Rust: the {@code select!} on the deadline in {@code renew_loop}.)
   */
  private LeaseServiceGrpc.LeaseServiceBlockingStub callBeforeDeadline() {
    long left = Math.max(1, deadline - time.nanoTime());
    return stub.withDeadlineAfter(Math.min(config.requestTimeout.toNanos(), left), TimeUnit.NANOSECONDS);
  }

  /**
   * Stops issuance for good: withdraws every grant. Returns true when this call stopped it (the
   * first reason is kept).
   */
  boolean stop(StopReason reason, String detail) {
    synchronized (this) {
      if (stop != null) {
        return false;
      }
      stop = new Stop(reason, detail);
      for (Slot s : slots) {
        s.publish(null);
      }
    }
    if (reason != StopReason.SHUT_DOWN) {
      LOG.log(Level.ERROR, "embedded generator stopped issuing in namespace {0}: {1}{2}",
          config.namespace, reason.description(), detail == null ? "" : " (" + detail + ")");
    }
    stopped.complete(reason);
    return true;
  }

  /** Publishes a checked grant, its deadline counted from {@code sent}; nothing once stopped. */
  synchronized void publish(LeaseGrant grant, long sent) {
    if (stop != null) {
      return;
    }
    long d = deadlineOf(sent, grant);
    for (int i = 0; i < slots.length; i++) {
      LeasedMachineId m = grant.getMachineIds(i);
      slots[i].publish(new Grant(m.getMachineId(), floorOf(m), m.getFenceMs(), d));
    }
  }

  /**
   * The floor of {@code m}, layout ms. A uint64 floor of 2^63 or more reads as negative in Java,
   * which every stamp would pass: it saturates instead, so nothing is stamped under it (a fence
   * that large reads as negative too, which refuses every stamp and needs nothing).
   */
  static long floorOf(LeasedMachineId m) {
    long floor = m.getFloorMs();
    return floor < 0 ? Long.MAX_VALUE : floor;
  }

  static long deadlineOf(long sent, LeaseGrant grant) {
    long ms = grant.getExpiresInMs();
    return sent + (ms < 0 || ms > Long.MAX_VALUE / 4_000_000 ? Long.MAX_VALUE / 4 : ms * 1_000_000);
  }

  /** Starts the renew task at once and the check task after one interval. */
  void begin(long deadline) {
    this.deadline = deadline;
    scheduler = time.newScheduler();
    scheduler.schedule(this::renewTask, 0);
    long every = config.checkInterval.toNanos();
    if (every > 0) {
      scheduler.schedule(this::checkTask, every);
    }
  }

  /** One renewal (Rust's {@code renew_loop} body); schedules the next. */
  void renewTask() {
    if (stop != null) {
      return;
    }
    long sent = time.nanoTime();
    if (sent - deadline >= 0) {
      stop(StopReason.EXPIRED, null);
      return;
    }
    RenewRequest.Builder request = RenewRequest.newBuilder()
        .setRequester(requester.toProto())
        .setNamespace(config.namespace)
        .setLeaseToken(token)
        .setNamespaceIncarnation(incarnation);
    if (config.sendClientTime) {
      request.setClientTimeUnixMs(time.unixMs());
    }
    LeaseGrant grant;
    try {
      grant = callBeforeDeadline().renew(request.build());
    } catch (StatusRuntimeException e) {
      if (e.getStatus().getCode() == Status.Code.PERMISSION_DENIED) {
        stop(StopReason.TOKEN_REFUSED, e.getStatus().getDescription());
        return;
      }
      long now = time.nanoTime();
      if (now - deadline >= 0) {
        stop(StopReason.EXPIRED, "no renewal answered before the deadline (" + e.getStatus().getCode() + ")");
        return;
      }
      long retry = Math.min(MAX_RETRY_NANOS, Math.max(MIN_RETRY_NANOS, Math.max(0, deadline - now) / 4));
      LOG.log(Level.WARNING, "Renew failed in namespace {0} ({1}); retrying in {2} ms",
          config.namespace, e.getStatus(), retry / 1_000_000);
      scheduleRenew(now + retry);
      return;
    }
    if (renewed(grant, sent)) {
      scheduleRenew(sent + (deadline - sent) / 2);
    }
  }

  /** Acts on a renewal's answer; true when the lease goes on (then {@link #deadline} moved). */
  private boolean renewed(LeaseGrant grant, long sent) {
    if (grant.getMachineIdsCount() == 0) {
      StopReason r = goneReason(grant.getGoneReasonValue());
      stop(r == null ? StopReason.LEASE_GONE : r, "Renew answered no machine ids");
      return false;
    }
    int[] ids = grant.getMachineIdsList().stream().mapToInt(LeasedMachineId::getMachineId).toArray();
    if (!java.util.Arrays.equals(ids, machineIds)) {
      stop(StopReason.MACHINE_IDS_CHANGED,
          "held " + java.util.Arrays.toString(machineIds) + ", renewed " + java.util.Arrays.toString(ids));
      return false;
    }
    if (grant.getExpiresInMs() == 0) {
      stop(StopReason.EXPIRED, "Renew granted no time");
      return false;
    }
    long past = pastFenceMs(layout, time.unixMs(), grant);
    if (past > 0) {
      // Stamping nothing while holding the machine ids helps no one: give them back.
      int released = releaseAll(StopReason.CLOCK_PAST_FENCE, past + " ms past the renewed fence");
      LOG.log(Level.WARNING, "released {0} machine ids: the local clock is past the renewed fence", released);
      return false;
    }
    publish(grant, sent);
    deadline = deadlineOf(sent, grant);
    return true;
  }

  private void scheduleRenew(long at) {
    long wake = at - deadline < 0 ? at : deadline;
    scheduler.schedule(this::renewTask, wake - time.nanoTime());
  }

  /** One Check (Rust's {@code check_loop} body); schedules the next. */
  void checkTask() {
    if (stop != null) {
      return;
    }
    CheckRequest.Builder request = CheckRequest.newBuilder()
        .setRequester(requester.toProto())
        .setNamespace(config.namespace)
        .setNamespaceIncarnation(incarnation)
        .setLeaseToken(token);
    for (int m : machineIds) {
      request.addMachineIds(m);
    }
    try {
      CheckResponse answer = callBeforeDeadline().check(request.build());
      if (!answer.getValid()) {
        StopReason r = goneReason(answer.getReasonValue());
        if (r != null) {
          stop(r, "Check: " + answer.getDetail());
          return;
        }
      }
    } catch (StatusRuntimeException e) {
      if (e.getStatus().getCode() == Status.Code.PERMISSION_DENIED) {
        stop(StopReason.TOKEN_REFUSED, e.getStatus().getDescription());
        return;
      }
      LOG.log(Level.DEBUG, "Check failed ({0}); issuing on below the fence", e.getStatus());
    }
    scheduler.schedule(this::checkTask, config.checkInterval.toNanos());
  }

  /** The stop reason of a "gone" answer ({@code LeaseCheckReason}), or null. */
  static StopReason goneReason(int reason) {
    switch (reason) {
      case LeaseCheckReason.LEASE_CHECK_REASON_LEASE_GONE_VALUE:
        return StopReason.LEASE_GONE;
      case LeaseCheckReason.LEASE_CHECK_REASON_NAMESPACE_GONE_VALUE:
        return StopReason.NAMESPACE_GONE;
      case LeaseCheckReason.LEASE_CHECK_REASON_ROLLED_BACK_VALUE:
        return StopReason.NAMESPACE_ROLLED_BACK;
      default:
        return null;
    }
  }

  /**
   * How far (ms) the wall clock {@code unixMs} is past the earliest fence of {@code grant}; 0
   * while it is at or below every fence (or before the epoch).
   */
  static long pastFenceMs(IdLayout layout, long unixMs, LeaseGrant grant) {
    long now = unixMs - layout.epochUnixMs();
    if (now < 0 || grant.getMachineIdsCount() == 0) {
      return 0;
    }
    long fence = Long.MAX_VALUE;
    for (LeasedMachineId m : grant.getMachineIdsList()) {
      fence = Math.min(fence, m.getFenceMs());
    }
    return now > fence ? now - fence : 0;
  }

  /**
   * Stops issuance for {@code reason}, drains every machine id and Releases them with the last
   * timestamp stamped on each; returns how many the server released (0 when it was stopped
   * already: the lease is gone or released, or when the call failed).
   */
  int releaseAll(StopReason reason, String detail) {
    boolean first = stop(reason, detail);
    Map<Integer, Long> lastUsed = new HashMap<>();
    for (int i = 0; i < slots.length; i++) {
      long last = slots[i].drain();
      if (last >= 0) {
        lastUsed.put(machineIds[i], last);
      }
    }
    return first ? release(lastUsed) : 0;
  }

  /** Release with {@code lastUsed} (machine id to layout ms); 0 when the call fails (logged). */
  int release(Map<Integer, Long> lastUsed) {
    return release(call(), config, requester, token, lastUsed);
  }

  static int release(LeaseServiceGrpc.LeaseServiceBlockingStub stub, EmbeddedGeneratorBuilder config,
      Requester requester, String token, Map<Integer, Long> lastUsed) {
    ReleaseRequest request = ReleaseRequest.newBuilder()
        .setRequester(requester.toProto())
        .setNamespace(config.namespace)
        .putAllLastUsedMs(lastUsed)
        .setLeaseToken(token)
        .build();
    try {
      return stub.release(request).getReleased();
    } catch (StatusRuntimeException e) {
      LOG.log(Level.WARNING, "Release failed ({0}); the machine ids free themselves when the lease expires",
          e.getStatus());
      return 0;
    }
  }

  /** Stops the background tasks (after issuance stopped). */
  void stopTasks() {
    if (scheduler != null) {
      scheduler.shutdown();
    }
  }
}
