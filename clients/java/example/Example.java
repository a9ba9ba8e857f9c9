import dev.snowkeep.client.IdPool;
import dev.snowkeep.client.IdStream;
import dev.snowkeep.client.SnowkeepClient;
import dev.snowkeep.client.SnowkeepException;
import java.util.Arrays;

/**
 * A runnable tour of the snowkeep Java client against a server at 127.0.0.1:50051 (or the
 * endpoints given as arguments): a batch, a stream, a pool and a decode.
 */
public final class Example {
  private Example() {}

  /**
   * Runs the tour.
   *
   * @param args endpoints, e.g. {@code http://127.0.0.1:50051}
   */
  public static void main(String[] args) {
    String[] endpoints = args.length > 0 ? args : new String[] {"http://127.0.0.1:50051"};
    try (SnowkeepClient client = SnowkeepClient.builder().endpoints(endpoints).build()) {
      long[] ids = client.nextIds(5);
      System.out.println("5 ids: " + Arrays.toString(ids));
      System.out.println("decoded: " + client.decode(ids[0]));
      try (IdStream stream = client.stream(10_000, 1_000)) {
        long count = stream.ids().count();
        System.out.println("streamed " + count + " ids");
      }
      try (IdPool pool = client.pool()) {
        System.out.println("from the pool: " + pool.next() + ", " + pool.next());
      }
    } catch (SnowkeepException e) {
      System.err.println("snowkeep said " + e.code() + ": " + e.description());
      System.exit(1);
    }
  }
}
