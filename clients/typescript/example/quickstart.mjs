// A runnable tour of @snowkeep/client against a server on 127.0.0.1:50051
// (scripts/run), or the endpoints given as arguments:
//   node example/quickstart.mjs [http://host:port ...]
import { SnowkeepClient, SnowkeepError } from "@snowkeep/client";

const endpoints = process.argv.length > 2 ? process.argv.slice(2) : ["127.0.0.1:50051"];
const client = new SnowkeepClient(endpoints, { requestTimeoutMs: 2000, retryBudgetMs: 5000 });
try {
  // Five ascending ids from one server, as bigints.
  const ids = await client.nextIds(5);
  console.log("nextIds:", ids.map(String).join(" "));

  // Exactly 3000 ids in batches of 1000, resumed on another endpoint if a server goes away.
  let n = 0;
  for await (const batch of client.stream(3000n, { batchSize: 1000 })) n += batch.length;
  console.log("stream: received", n, "ids");

  // A prefetching pool: next() is a local pop.
  const pool = client.pool({ batch: 100 });
  console.log("pool:", String(await pool.next()), String(await pool.next()));
  pool.close();

  // An id's parts under the server's layout.
  console.log("decode:", await client.decode(ids[0]));

  // A call with a deadline of its own: rejects with AbortError at the deadline.
  await client.nextIds(1, { signal: AbortSignal.timeout(1000) });

  // A refused request surfaces as SnowkeepError with the gRPC code.
  await client.nextIds(0).catch((e) => {
    if (!(e instanceof SnowkeepError)) throw e;
    console.log("refused:", e.codeName, "-", e.message);
  });
} finally {
  client.close();
}
