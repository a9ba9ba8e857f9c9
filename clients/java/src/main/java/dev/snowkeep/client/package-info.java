/**
 * The snowkeep Java client: {@link dev.snowkeep.client.SnowkeepClient} (built with {@link
 * dev.snowkeep.client.SnowkeepClient#builder()}) hands out 63-bit snowflake ids from one or more
 * snowkeep servers, with failover and retries, a resuming stream ({@link
 * dev.snowkeep.client.IdStream}), a prefetching pool ({@link dev.snowkeep.client.IdPool}) and
 * id decoding ({@link dev.snowkeep.client.IdLayout}). Every error is a {@link
 * dev.snowkeep.client.SnowkeepException} carrying a gRPC status code.
 */
package dev.snowkeep.client;
