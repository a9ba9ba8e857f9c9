package dev.snowkeep.client;

/**
 * The parts of an id under its namespace's layout.
 *
 * @param unixMs the id's timestamp in milliseconds since the Unix epoch (the first millisecond
 *     of its tick)
 * @param machineId the machine id that issued it
 * @param sequence its sequence within the tick
 */
public record DecodedId(long unixMs, long machineId, long sequence) {}
