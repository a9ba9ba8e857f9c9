package dev.snowkeep.client;

/**
 * The bit layout of a namespace's ids, as {@code InfoService.GetInfo} reports it: from the most
 * significant bit, {@code timestampBits} of ticks since the epoch, then {@code machineBits} of
 * machine id, then {@code sequenceBits} of sequence; 32 to 63 bits in all.
 *
 * @param timestampBits bits of the timestamp field (ticks of {@code timeUnitMs} since the epoch)
 * @param machineBits bits of the machine id field
 * @param sequenceBits bits of the per-tick sequence
 * @param epochUnixMs the layout's epoch, in milliseconds since the Unix epoch
 * @param timeUnitMs the tick in milliseconds (1, 10, 100 or 1000); 0 from an old server means 1
 */
public record IdLayout(
    int timestampBits, int machineBits, int sequenceBits, long epochUnixMs, int timeUnitMs) {

  /**
   * The largest id of the layout: 2^(timestampBits + machineBits + sequenceBits) − 1.
   *
   * @return the largest id, at most 2^63 − 1
   */
  public long maxId() {
    int bits = timestampBits + machineBits + sequenceBits;
    return bits >= 63 ? Long.MAX_VALUE : (1L << bits) - 1;
  }

  /**
   * Splits {@code id} into its timestamp, machine id and sequence.
   *
   * @param id an id of this layout (never negative: ids are at most 63 bits)
   * @return the parts, the timestamp as Unix milliseconds ({@code epochUnixMs + ticks ×
   *     timeUnitMs})
   * @throws SnowkeepException INVALID_ARGUMENT naming {@code id} when it is negative or above
   *     {@link #maxId()}
   */
  public DecodedId decode(long id) {
    if (id < 0 || id > maxId()) {
      throw SnowkeepException.invalid(
          "id",
          Long.toUnsignedString(id) + " is above the layout's largest id " + maxId() + " ("
              + (timestampBits + machineBits + sequenceBits) + " bits)");
    }
    long sequence = id & mask(sequenceBits);
    long machine = (id >>> sequenceBits) & mask(machineBits);
    long ticks = id >>> (sequenceBits + machineBits);
    return new DecodedId(epochUnixMs + ticks * unitMs(), machine, sequence);
  }

  /**
   * Checks the layout as the server's own layout type does: each bit count positive, 32 to 63
   * bits in all, at most 16 machine bits, an epoch not negative, and a time unit of 1, 10, 100 or
   * 1000 ms (0, from a server older than time units, reads as 1 ms). The embedded generator
   * refuses a grant whose layout fails this ({@link GrantRejectedException.Kind#INVALID_LAYOUT}).
   *
   * @return null when the layout is valid, else a sentence saying what is wrong
   */
  public String problem() {
    int bits = timestampBits + machineBits + sequenceBits;
    if (timestampBits <= 0 || machineBits <= 0 || sequenceBits <= 0 || bits < 32 || bits > 63) {
      return "layout bits must each be positive and sum to 32..63, got timestamp " + timestampBits
          + " + machine " + machineBits + " + sequence " + sequenceBits;
    }
    if (machineBits > 16) {
      return "machine_bits is " + machineBits + ", at most 16 are supported";
    }
    if (epochUnixMs < 0) {
      return "epoch " + epochUnixMs + " is before the Unix epoch";
    }
    int unit = unitMs();
    if (unit != 1 && unit != 10 && unit != 100 && unit != 1000) {
      return "time unit " + timeUnitMs + " ms is not supported: use 1, 10, 100 or 1000 ms";
    }
    return null;
  }

  /**
   * The time unit of the timestamp field in milliseconds, with the 0 of an old server read as 1.
   *
   * @return 1, 10, 100 or 1000 for a valid layout
   */
  public int unitMs() {
    return timeUnitMs == 0 ? 1 : timeUnitMs;
  }

  /**
   * How many machine ids the layout has: 2^machineBits.
   *
   * @return the count of machine ids
   */
  public long machineIdCount() {
    return 1L << machineBits;
  }

  /**
   * Ids per tick per machine id: 2^sequenceBits.
   *
   * @return the sequences of one tick
   */
  public long sequencesPerTick() {
    return 1L << sequenceBits;
  }

  /**
   * The last layout millisecond (ms since the epoch) an id can carry: the last ms of tick
   * 2^timestampBits − 1, saturating at {@code Long.MAX_VALUE}.
   *
   * @return the largest timestamp in layout ms
   */
  public long maxTimestamp() {
    long ticks = timestampBits >= 63 ? Long.MAX_VALUE : 1L << timestampBits;
    long unit = unitMs();
    return ticks > Long.MAX_VALUE / unit ? Long.MAX_VALUE : ticks * unit - 1;
  }

  /**
   * The first millisecond of the tick that {@code layoutMs} falls in: every millisecond of a
   * tick stamps the same timestamp field.
   *
   * @param layoutMs milliseconds since the layout's epoch, not negative
   * @return {@code layoutMs} rounded down to a multiple of the time unit
   */
  public long tickStart(long layoutMs) {
    return layoutMs - layoutMs % unitMs();
  }

  /**
   * The first layout millisecond at which a holder whose floor is {@code floorMs} may stamp: the
   * first ms of the tick after the floor's (floor + 1 at 1 ms units), since a stamp is a tick's
   * first ms and must be above the floor (docs/design.md, fence protocol rule 3).
   *
   * @param floorMs a floor in layout ms
   * @return the first stampable layout ms, saturating
   */
  public long firstStampAfter(long floorMs) {
    long start = tickStart(floorMs);
    return start > Long.MAX_VALUE - unitMs() ? Long.MAX_VALUE : start + unitMs();
  }

  /**
   * Packs an id: the tick {@code layoutMs / unit} in the timestamp field, then the machine id,
   * then the sequence. The caller guarantees the parts fit.
   *
   * @param layoutMs the timestamp in layout ms (at most {@link #maxTimestamp()})
   * @param machineId the machine id, below {@link #machineIdCount()}
   * @param sequence the sequence, below {@link #sequencesPerTick()}
   * @return the id, never negative
   */
  public long encode(long layoutMs, long machineId, long sequence) {
    return ((layoutMs / unitMs()) << (machineBits + sequenceBits))
        | (machineId << sequenceBits)
        | sequence;
  }

  private static long mask(int bits) {
    return bits >= 64 ? -1L : (1L << bits) - 1;
  }
}
