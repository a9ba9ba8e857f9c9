package dev.snowkeep.client;

/**
 * 68 bytes of padding that HotSpot lays out before a {@link Slot}'s own fields (a superclass's
 * fields come first), so that the fields one pinned worker writes on every id never share a
 * 64-byte cache line with the slot allocated before it, which another worker writes (false
 * sharing). The int fills the gap after a 12-byte object header, where a subclass field could
 * otherwise land. Package-private; never read.
 */
abstract class SlotPadding {
  int p0;
  long p1;
  long p2;
  long p3;
  long p4;
  long p5;
  long p6;
  long p7;
  long p8;
}
