package dev.snowkeep.client;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.security.SecureRandom;
import java.time.Instant;

/**
 * Who an embedded generator is to the Lease API ({@code snowkeep.v1.Requester}): the host's
 * machine id, the process id, the process start time and a random nonce drawn per generator.
 * The start time keeps a restarted process apart from its predecessor (even as PID 1 in a
 * container); the nonce keeps two generators of one process apart, so they never share machine
 * ids. The identity names a requester and grants nothing: Renew, Check and Release also need the
 * lease token Acquire returned, which the generator keeps in memory only.
 *
 * @param hostId the host's machine id ({@code /etc/machine-id}), else its host name
 * @param pid the process id
 * @param startUnixMs the process start time, ms since the Unix epoch
 * @param nonce 32 random hex digits (the proto allows 16 to 64)
 */
public record Requester(String hostId, long pid, long startUnixMs, String nonce) {
  private static final SecureRandom RANDOM = new SecureRandom();
  private static final long FIRST_CALL_MS = System.currentTimeMillis();

  /**
   * This process: {@code /etc/machine-id} (else {@code /var/lib/dbus/machine-id}, else the host
   * name), {@link ProcessHandle#pid()}, the process start time from {@link
   * ProcessHandle.Info#startInstant()} (else the time this class loaded), and a fresh nonce.
   *
   * @return a new requester identity of this process
   */
  public static Requester current() {
    ProcessHandle self = ProcessHandle.current();
    long start = self.info().startInstant().map(Instant::toEpochMilli).orElse(FIRST_CALL_MS);
    return new Requester(readHostId(), self.pid(), start, newNonce());
  }

  /**
   * The same identity with a fresh nonce: another requester of the same process (what start does
   * when Acquire says this identity already holds machine ids without the token).
   *
   * @return a copy with a new nonce
   */
  public Requester withNewNonce() {
    return new Requester(hostId, pid, startUnixMs, newNonce());
  }

  /**
   * A short name for logs: the first 12 hex digits of the SHA-256 of {@code
   * host_id:pid:start_unix_ms:nonce}, the tag the server logs requesters by.
   *
   * @return 12 lower-case hex digits
   */
  public String tag() {
    try {
      byte[] d = MessageDigest.getInstance("SHA-256").digest(
          (hostId + ":" + pid + ":" + startUnixMs + ":" + nonce).getBytes(StandardCharsets.UTF_8));
      StringBuilder b = new StringBuilder();
      for (int i = 0; i < 6; i++) {
        b.append(String.format("%02x", d[i] & 0xff));
      }
      return b.toString();
    } catch (NoSuchAlgorithmException e) {
      throw new IllegalStateException("SHA-256 is missing from this JVM", e);
    }
  }

  /** The protobuf form. */
  dev.snowkeep.v1.Requester toProto() {
    return dev.snowkeep.v1.Requester.newBuilder()
        .setHostId(hostId)
        .setPid((int) pid)
        .setStartUnixMs(startUnixMs)
        .setNonce(nonce)
        .build();
  }

  private static String newNonce() {
    return String.format("%016x%016x", RANDOM.nextLong(), RANDOM.nextLong());
  }

  private static String readHostId() {
    for (String p : new String[] {"/etc/machine-id", "/var/lib/dbus/machine-id", "/proc/sys/kernel/hostname"}) {
      try {
        String id = keep(Files.readString(Path.of(p)));
        if (!id.isEmpty()) {
          return id;
        }
      } catch (IOException | RuntimeException e) {
        // Try the next source.
      }
    }
    try {
      String id = keep(java.net.InetAddress.getLocalHost().getHostName());
      return id.isEmpty() ? "unknown-host" : id;
    } catch (IOException e) {
      return "unknown-host";
    }
  }

  /** The characters the server accepts: A-Z a-z 0-9 . _ -, at most 128. */
  private static String keep(String s) {
    StringBuilder b = new StringBuilder();
    for (char c : s.trim().toCharArray()) {
      if (b.length() < 128 && (Character.isLetterOrDigit(c) && c < 128 || ".-_".indexOf(c) >= 0)) {
        b.append(c);
      }
    }
    return b.toString();
  }
}
