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
    long unit = timeUnitMs == 0 ? 1 : timeUnitMs;
    return new DecodedId(epochUnixMs + ticks * unit, machine, sequence);
  }

  private static long mask(int bits) {
    return bits >= 64 ? -1L : (1L << bits) - 1;
  }
}
