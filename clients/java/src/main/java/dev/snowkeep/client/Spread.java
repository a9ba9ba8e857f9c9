package dev.snowkeep.client;

/**
 * How {@link EmbeddedGenerator#nextId()} and {@link EmbeddedGenerator#nextIds(int)} spread calls
 * over the machine ids a generator holds (IdKeeper's spreads; the third one, one machine id
 * pinned to each worker thread, is {@link EmbeddedGenerator#pin()}). With one machine id both
 * are the same: every call goes to it.
 */
public enum Spread {
  /**
   * Call k goes to machine id k mod N, through one shared atomic counter (every calling thread
   * writes it, so its cache line moves between cores). A machine id that cannot issue now is
   * skipped for the next one.
   */
  ROUND_ROBIN,
  /**
   * A call goes to machine id {@code thread id mod N} ({@link Thread#getId()}), so threads
   * share no counter; threads whose ids are equal mod N share a machine id (and its lock). A
   * machine id that cannot issue now is skipped for the next one.
   */
  BY_THREAD
}
